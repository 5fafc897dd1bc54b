"""all-MiniLM-L6-v2 on ONNX Runtime: the same model and the same vectors, on every core, replayable.

Why a second runtime for the same model (measured, see bench/README.md "Decision latency"):

- ``InferenceSession.run`` is one C++ call that releases the GIL for the whole forward pass, so two
  worker threads really use two cores. The sentence-transformers path holds the GIL between torch ops,
  so two copies of it on two threads ran no faster than one.
- Each text runs alone (batch of one, no padding). That wastes nothing on padding, and a text's
  vector never depends on what it was batched with: decisions replay exactly.
- The exported graph computes what sentence-transformers computes (BERT → mean pooling over the
  attention mask; normalisation happens here): vectors match the torch path at cosine >= 0.99999, so
  heads trained on either are interchangeable and the encoder keeps the id ``minilm-l6-v2``.

The ONNX file is exported once from the bundled safetensors weights (torch's exporter, offline, a few
seconds) into a cache directory and reused by every later start; nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.encoders.minilm import MINILM_ID, quiet_transformers
from classifiers.encoders.per_text import PerTextEncoder

#: Bump when the exported graph changes (inputs, outputs, opset, pooling), so stale caches are not reused.
EXPORT_FORMAT = "bert-meanpool-v1"
OPSET = 17
CACHE_ENV = "POINTSMAN_CACHE_DIR"


def cache_root() -> Path:
    """Where derived model files live.

    ``$POINTSMAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pointsman``, else ``~/.cache/pointsman``.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pointsman"


def _weights_digest(model_dir: Path) -> str:
    weights = model_dir / "model.safetensors"
    stat = weights.stat()
    return _digest_of(str(weights), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    # Hashing the 90 MB of weights takes ~0.3 s: once per process per file version (size, mtime).
    h = hashlib.sha256(EXPORT_FORMAT.encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def onnx_path_for(model_dir: Path, cache_dir: Path | None = None) -> Path:
    """The cache file the export of ``model_dir`` goes to (keyed by the weights' sha256 and the format)."""
    root = cache_dir if cache_dir is not None else cache_root()
    return root / "onnx" / f"{MINILM_ID}-{_weights_digest(model_dir)}.onnx"


_export_lock = threading.Lock()
log = logging.getLogger("pointsman.encoders")


def ensure_onnx(model_dir: Path, cache_dir: Path | None = None) -> Path:
    """Export ``model_dir`` to ONNX unless the cache already holds it; returns the file.

    The file is written to a temporary name and renamed into place, so a crash or a concurrent start
    never leaves a half-written model behind (two processes exporting at once both write whole files).
    When the cache directory cannot be written (a read-only home in a container), the export goes to
    ``<tmp>/pointsman-<uid>`` instead, with a warning naming ``POINTSMAN_CACHE_DIR``.
    """
    target = onnx_path_for(model_dir, cache_dir)
    if target.is_file():
        return target
    with _export_lock:
        if target.is_file():
            return target
        try:
            return _export_into(model_dir, target)
        except OSError as exc:
            fallback = onnx_path_for(model_dir, Path(tempfile.gettempdir()) / f"pointsman-{os.getuid()}")
            if fallback.is_file():
                return fallback
            log.warning(
                "cannot write the MiniLM ONNX export to %s (%s); using %s: set %s to a writable directory "
                "to keep it across restarts",
                target.parent, exc.strerror or exc, fallback.parent, CACHE_ENV,
            )
            return _export_into(model_dir, fallback)


def _export_into(model_dir: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting all-MiniLM-L6-v2 to ONNX once (a few seconds): %s", target)
    fd, tmp_name = tempfile.mkstemp(prefix=target.stem, suffix=".onnx.tmp", dir=target.parent)
    os.close(fd)
    try:
        _export(model_dir, Path(tmp_name))
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; the cache may be shared
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _export(model_dir: Path, out: Path) -> None:
    """Trace BERT + masked mean pooling with torch's TorchScript-based exporter (deterministic, offline)."""
    import warnings

    import torch
    from transformers import AutoModel

    with quiet_transformers():
        bert = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    example = torch.tensor([[101, 7592, 2088, 102]], dtype=torch.int64)
    dynamic = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}}
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter is deprecated in favour of the dynamo one, which needs onnxscript
        # and emits a larger graph for this model; its warnings are not actionable here.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            MeanPooled(bert),
            (example, torch.ones_like(example)),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={**dynamic, "embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


class OnnxMiniLMEncoder(PerTextEncoder):
    """all-MiniLM-L6-v2 on ONNX Runtime in float32, one text per run, ``workers`` runs at once.

    Args:
        workers: Texts encoded in parallel (threads, each running one single-threaded forward pass).
            On a 2-core machine 2 uses both cores; the event loop's own work is small next to a pass.
            A call with a single text splits its one pass over ``workers`` threads instead.
        model_dir: Override the model directory (default: the bundled one).
        cache_dir: Where the exported ONNX file is kept (default: :func:`cache_root`).
        max_tokens: Word pieces read per text (default: the model's 256, as sentence-transformers).

    Inputs longer than ``max_tokens`` are truncated like sentence-transformers truncates them; the
    conversation text puts the last user turn first so it is always inside that window.
    """

    id: str = MINILM_ID
    dim: int = 384

    def __init__(
        self,
        workers: int = 1,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__(workers, model_dir, max_tokens)
        import onnxruntime as ort

        self.onnx_path = ensure_onnx(self.model_dir, cache_dir)
        self.runtime = f"onnx float32, {workers} worker(s)"
        # One thread per run: parallelism comes from running several texts at once, which scales
        # without the spin-waiting that intra-op thread pools do when the other core is busy.
        # InferenceSession.run is documented thread-safe: one session serves every worker.
        self._session = self._new_session(ort, threads=1)
        # A lone text (every text at concurrency 1) would leave the other cores idle: it runs on a
        # second session whose pass is split over ``workers`` threads, spinning off (measured on 2
        # cores: p50 32 vs 55 ms per RouteLLM prompt). MLAS splits the work without reordering any
        # sum, so its vectors are bit-identical to the single-threaded session's (tested).
        self._solo = self._new_session(ort, threads=workers) if workers > 1 else self._session

    def _new_session(self, ort: Any, threads: int) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if threads > 1:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])

    def _pass(self, ids: Sequence[int], solo: bool) -> np.ndarray:
        input_ids = np.asarray([ids], dtype=np.int64)
        session = self._solo if solo else self._session
        out = session.run(None, {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)})
        return np.asarray(out[0][0], dtype=np.float32)
