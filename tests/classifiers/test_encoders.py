"""Encoders on the real bundled model and the committed static artifact, and the async batching front."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from classifiers.batching import BatchingEncoder
from classifiers.encoders import Encoder, load_encoder
from classifiers.encoders.static import DEFAULT_STATIC_DIR

# Paraphrase pairs on unrelated topics: (0, 1), (2, 3), ... are neighbours.
PAIRS = [
    "How do I reverse a list in Python?",
    "What is the idiomatic way to reverse an array in Python?",
    "Who won the football World Cup in 2018?",
    "Which country was the 2018 FIFA World Cup champion?",
    "Solve for x: 3x + 5 = 20.",
    "Find x if 3 times x plus 5 equals 20.",
    "Write a short poem about the autumn sea.",
    "Compose a brief poem about the ocean in fall.",
    "What are the symptoms of iron deficiency?",
    "How can I tell if I am low on iron?",
    "Translate good morning into French.",
    "How do you say good morning in French?",
]


@pytest.fixture(scope="module", autouse=True)
def _offline() -> Iterator[None]:
    """Nothing here may reach the network: a download attempt fails instead of silently succeeding."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def minilm(_offline: None) -> Encoder:
    return load_encoder("minilm")


@pytest.fixture(scope="module")
def static(_offline: None) -> Encoder:
    return load_encoder("static")


@pytest.fixture(scope="module")
def scripted_bf16(_offline: None) -> Iterator[Encoder]:
    from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

    encoder = ScriptedMiniLMEncoder(workers=2, dtype="bfloat16")
    yield encoder
    encoder.close()


@pytest.fixture(params=["minilm", "static"])
def encoder(request: pytest.FixtureRequest) -> Encoder:
    return request.getfixturevalue(request.param)


def test_encoder_ids_and_dims(minilm: Encoder, static: Encoder) -> None:
    assert (minilm.id, minilm.dim) == ("minilm-l6-v2", 384)
    assert (static.id, static.dim) == ("minilm-static-256", 256)
    assert isinstance(minilm, Encoder) and isinstance(static, Encoder)


def test_unknown_encoder_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown encoder 'bert'.*minilm.*static"):
        load_encoder("bert")


def test_vectors_are_normalised_float32_of_the_right_shape(encoder: Encoder) -> None:
    texts = ["hello", "A much longer sentence about distributed databases and consensus. " * 40, "ünïcødé ✓"]
    vectors = encoder.encode(texts)
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, encoder.dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert encoder.encode([]).shape == (0, encoder.dim)


def test_encoding_is_deterministic_and_independent_of_batching(encoder: Encoder) -> None:
    # The batching front relies on this: a text's vector must not depend on what it was batched with.
    alone = np.vstack([encoder.encode([text]) for text in PAIRS])
    together = encoder.encode(PAIRS)
    np.testing.assert_allclose(alone, together, atol=1e-5)
    np.testing.assert_array_equal(encoder.encode(PAIRS[:3]), encoder.encode(PAIRS[:3]))


def test_paraphrases_are_closer_than_unrelated_texts(encoder: Encoder) -> None:
    close = encoder.encode(["How do I reverse a list in Python?", "What's the way to reverse an array in Python?"])
    far = encoder.encode(["The French Revolution began in 1789 with the storming of the Bastille."])
    assert float(close[0] @ close[1]) > float(close[0] @ far[0]) + 0.2


def test_static_agrees_with_minilm_on_nearest_neighbours(minilm: Encoder, static: Encoder) -> None:
    def neighbours(vectors: np.ndarray) -> np.ndarray:
        sims = vectors @ vectors.T
        np.fill_diagonal(sims, -np.inf)
        return sims.argmax(axis=1)

    partner = np.arange(len(PAIRS)) ^ 1  # 0<->1, 2<->3, ...
    nn_minilm, nn_static = neighbours(minilm.encode(PAIRS)), neighbours(static.encode(PAIRS))
    assert np.mean(nn_minilm == partner) == 1.0
    # Static embeddings have no context (a paraphrase sharing no word can be missed), but most
    # neighbourhoods must be the teacher's.
    assert np.mean(nn_static == nn_minilm) >= 0.75


def test_static_artifact_is_small_safe_and_matches_its_manifest() -> None:
    manifest = json.loads((DEFAULT_STATIC_DIR / "manifest.json").read_text())
    assert manifest["encoder_id"] == "minilm-static-256"
    assert manifest["source_model"]["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    files = sorted(p.name for p in DEFAULT_STATIC_DIR.iterdir())
    assert files == sorted([*manifest["files"], "manifest.json"])
    # Only inert formats: nothing in a shipped artifact may be unpickled or executed.
    assert all(Path(name).suffix in {".json", ".safetensors"} for name in files)
    for name, meta in manifest["files"].items():
        data = (DEFAULT_STATIC_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"], f"{name} differs from the manifest"
    assert sum((DEFAULT_STATIC_DIR / name).stat().st_size for name in files) < 9_000_000


def test_static_encoder_does_not_import_torch() -> None:
    # Choosing the fast encoder must not pay torch's import time and memory.
    code = (
        "import sys; from classifiers.encoders import load_encoder; "
        "load_encoder('static').encode(['x']); print('torch' in sys.modules)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_missing_static_artifact_fails_clearly_instead_of_downloading(tmp_path: Path) -> None:
    from classifiers.encoders.static import StaticEncoder

    with pytest.raises(FileNotFoundError, match=r"model\.safetensors is missing.*classifiers\.encoders\.distill"):
        StaticEncoder(tmp_path / "nowhere")


# --- BatchingEncoder ---------------------------------------------------------------------------------


async def test_concurrent_encodes_share_batches_and_match_direct_encoding(minilm: Encoder) -> None:
    texts = [f"Request number {i}: explain topic {i * 7 % 13} in simple words." for i in range(64)]
    direct = minilm.encode(texts)
    # Batches are what the batched runtimes (sentence-transformers) get; per-text ones stream (below).
    async with BatchingEncoder(minilm, max_batch=32, stream=False) as batcher:
        vectors = await asyncio.gather(*(batcher.encode(t) for t in texts))
        np.testing.assert_allclose(np.vstack(vectors), direct, atol=1e-5)
        stats = batcher.stats()
        assert (stats.misses, stats.hits, stats.encoded) == (64, 0, 64)
        assert stats.batches < 64  # concurrent requests shared forward passes
        assert stats.mean_batch_size > 1

        again = await asyncio.gather(*(batcher.encode(t) for t in texts))
        after = batcher.stats()
        assert (after.hits, after.batches) == (64, stats.batches)  # all from the cache, no new batch
        assert all(a is b for a, b in zip(again, vectors, strict=True))


async def test_identical_concurrent_texts_are_encoded_once(static: Encoder) -> None:
    async with BatchingEncoder(static) as batcher:
        vectors = await asyncio.gather(*(batcher.encode("same prompt") for _ in range(10)))
        assert batcher.stats().encoded == 1
        assert all(v is vectors[0] for v in vectors)
        assert not vectors[0].flags.writeable  # shared with the cache: callers cannot corrupt it


async def test_cache_is_lru_bounded(static: Encoder) -> None:
    async with BatchingEncoder(static, cache_size=2) as batcher:
        for text in ("a", "b", "a", "c"):  # "b" is least recently used when "c" arrives
            await batcher.encode(text)
        await batcher.encode("a")
        assert batcher.stats().hits == 2
        await batcher.encode("b")
        assert batcher.stats().hits == 2  # evicted, encoded again
        assert batcher.stats().encoded == 4


async def test_cache_size_zero_disables_caching(static: Encoder) -> None:
    async with BatchingEncoder(static, cache_size=0) as batcher:
        await batcher.encode("x")
        await batcher.encode("x")
        assert (batcher.stats().hits, batcher.stats().encoded) == (0, 2)


@pytest.mark.parametrize("runtime", ["minilm", "scripted_bf16"])
async def test_event_loop_keeps_running_during_forward_passes(runtime: str, request: pytest.FixtureRequest) -> None:
    # The ONNX and TorchScript runtimes both claim to release the GIL for a whole pass.
    minilm: Encoder = request.getfixturevalue(runtime)
    texts = [f"{i} " + "a fairly long request about databases, caching and replication. " * 20 for i in range(32)]
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    # The gateway freezes its start-up heap (gateway/app.py), so a full collection there walks only
    # what requests allocated. This test process has torch, transformers and every earlier test's
    # objects on its heap: an unfrozen gen-2 collection took ~250 ms here and stalled the loop
    # whichever encoder ran. Freeze the same way so only the encoder is under test.
    gc.collect()
    gc.freeze()
    try:
        async with BatchingEncoder(minilm) as batcher:  # streamed: each text on a worker thread
            tick = asyncio.create_task(ticker())
            started = time.perf_counter()
            await asyncio.gather(*(batcher.encode(t) for t in texts))
            elapsed = time.perf_counter() - started
            stop.set()
            await tick
    finally:
        gc.unfreeze()
    assert batcher.stream and batcher.stats().batches == len(texts)
    # Each forward pass takes about elapsed * workers / texts seconds; had one run on the loop, the
    # ticker would have stalled that long. It keeps ticking far more often than that.
    per_pass = elapsed * getattr(minilm, "workers", 1) / len(texts)
    assert per_pass > 0.01, "forward passes too fast to tell anything"
    # A pass run on the loop would stall it for the whole pass. Below that, the ticker also waits for
    # the GIL's switch interval (5 ms) while a worker runs Python between passes: on a fast CPU
    # (14 ms passes) that alone reached 9 ms, so the bound is most of a pass, not half of one.
    assert max(gaps) < per_pass * 0.8, f"loop stalled {max(gaps):.3f}s; a pass takes {per_pass:.3f}s"


class _FailsOn:
    """A real encoder that fails for one text, to check errors reach the callers of that batch only."""

    def __init__(self, inner: Encoder, poison: str) -> None:
        self.inner, self.poison = inner, poison
        self.id, self.dim = inner.id, inner.dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.poison in texts:
            raise RuntimeError("encoder exploded")
        return self.inner.encode(texts)


async def test_encoder_errors_reach_callers_and_are_not_cached(static: Encoder) -> None:
    async with BatchingEncoder(_FailsOn(static, "boom")) as batcher:
        with pytest.raises(RuntimeError, match="encoder exploded"):
            await batcher.encode("boom")
        assert batcher.stats().batches == 0
        # The batcher keeps working after a failed batch.
        vector = await batcher.encode("fine")
        np.testing.assert_allclose(vector, static.encode(["fine"])[0], atol=1e-6)
        with pytest.raises(RuntimeError, match="encoder exploded"):
            await batcher.encode("boom")


async def test_closed_batcher_refuses_new_work(static: Encoder) -> None:
    batcher = BatchingEncoder(static)
    batcher.start()
    await batcher.encode("cached before close")
    await batcher.close()
    await batcher.close()  # idempotent
    assert (await batcher.encode("cached before close")).shape == (static.dim,)  # cache hits still served
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.encode("new text")


def test_minilm_bf16_matches_fp32_and_auto_follows_the_cpu() -> None:
    from classifiers.encoders.minilm import MiniLMEncoder, cpu_has_native_bf16, resolve_dtype

    assert resolve_dtype("auto") == ("bfloat16" if cpu_has_native_bf16() else "float32")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int4")
    texts = ["What is the capital of France?", "Prove there are infinitely many primes of the form 4k+3."]
    fp32 = MiniLMEncoder(dtype="float32").encode(texts)
    bf16 = MiniLMEncoder(dtype="bfloat16").encode(texts)
    assert bf16.dtype == np.float32
    # Close enough that heads trained on fp32 embeddings stay valid on bf16 ones.
    assert float((fp32 * bf16).sum(axis=1).min()) > 0.999


def test_minilm_runs_on_onnx_by_default_and_gives_the_sentence_transformers_vectors(minilm: Encoder) -> None:
    from classifiers.encoders.minilm import MiniLMEncoder
    from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder

    assert isinstance(minilm, OnnxMiniLMEncoder)
    texts = [*PAIRS, "", "x", "ünïcødé ✓ 😀", "A much longer text about consensus protocols. " * 80]
    reference = MiniLMEncoder().encode(texts)
    # The same model through another runtime: heads trained on either kind of vector stay valid.
    np.testing.assert_allclose(minilm.encode(texts), reference, atol=2e-5)
    assert load_encoder("minilm", runtime="torch").encode(texts[:2]).shape == (2, 384)


def test_onnx_minilm_parallel_workers_are_exact_and_order_independent(minilm: Encoder) -> None:
    from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder

    texts = [f"{text} (variant {i})" for i, text in enumerate(PAIRS * 3)]
    one_worker = OnnxMiniLMEncoder(workers=1).encode(texts)
    four = OnnxMiniLMEncoder(workers=4)
    try:
        # Bit-for-bit: every text runs alone, so neither batch-mates nor thread scheduling move a vector.
        np.testing.assert_array_equal(four.encode(texts), one_worker)
        np.testing.assert_array_equal(four.encode(texts[::-1])[::-1], one_worker)
        # A lone text runs on the session that splits one pass over the workers: still the same bits.
        np.testing.assert_array_equal(np.vstack([four.encode([text]) for text in texts]), one_worker)
    finally:
        four.close()


def test_torchscript_minilm_gives_the_sentence_transformers_vectors() -> None:
    from classifiers.encoders.minilm import MiniLMEncoder
    from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

    # Lengths from 2 word pieces to the 256-piece truncation (the position table is sliced per text).
    texts = [*PAIRS, "", "x", "ünïcødé ✓ 😀", "A much longer text about consensus protocols. " * 80]
    scripted = ScriptedMiniLMEncoder(workers=1, dtype="float32")
    np.testing.assert_allclose(scripted.encode(texts), MiniLMEncoder().encode(texts), atol=2e-5)


def test_torchscript_minilm_serves_without_importing_transformers() -> None:
    # transformers costs ~5 s of start-up; the scripted module reads the safetensors itself.
    code = (
        "import sys; from classifiers.encoders import load_encoder; "
        "load_encoder('minilm', runtime='torchscript').encode(['x']); print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


def test_torchscript_bf16_stays_close_to_fp32_and_is_exact_per_text(scripted_bf16: Encoder, minilm: Encoder) -> None:
    from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

    texts = [f"{text} (variant {i})" for i, text in enumerate(PAIRS * 3)] + ["Explain consensus. " * 60]
    vectors = scripted_bf16.encode(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), 384)
    # Close enough that heads trained on float32 vectors stay valid (bench/routing_quality.py checks APGR).
    assert float((vectors * minilm.encode(texts)).sum(axis=1).min()) > 0.999
    # Every text runs alone: batch-mates, order, worker count and a lone call give the same bits.
    np.testing.assert_array_equal(scripted_bf16.encode(texts[::-1])[::-1], vectors)
    np.testing.assert_array_equal(np.vstack([scripted_bf16.encode([text]) for text in texts]), vectors)
    one_worker = ScriptedMiniLMEncoder(workers=1, dtype="bfloat16")
    np.testing.assert_array_equal(one_worker.encode(texts), vectors)


def test_torchscript_bf16_packed_weights_compute_what_plain_linear_layers_do(scripted_bf16: Encoder) -> None:
    from classifiers.encoders.minilm import cpu_has_native_bf16
    from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

    assert isinstance(scripted_bf16, ScriptedMiniLMEncoder)
    # 6 layers x (query, key, value, attention output, intermediate, output).
    assert scripted_bf16.packed_linears == (36 if cpu_has_native_bf16() else 0)
    plain = ScriptedMiniLMEncoder(workers=1, dtype="bfloat16", pack_weights=False)
    assert plain.packed_linears == 0
    texts = [*PAIRS, "Explain consensus. " * 60]
    # Bit-identical on the AMX Xeon it was measured on; bf16 rounding is the only allowed difference.
    np.testing.assert_allclose(scripted_bf16.encode(texts), plain.encode(texts), atol=2e-3)


def test_torchscript_falls_back_to_unpacked_weights_when_packing_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from classifiers.encoders import minilm_script
    from classifiers.encoders.minilm import cpu_has_native_bf16

    def no_packed_kernels(self: object, weight: object, bias: object) -> None:
        raise RuntimeError("could not create a primitive descriptor")  # what oneDNN says without the kernels

    monkeypatch.setattr(minilm_script.PackedLinear, "__init__", no_packed_kernels)
    encoder = minilm_script.ScriptedMiniLMEncoder(workers=1, dtype="bfloat16")
    assert encoder.packed_linears == 0
    if cpu_has_native_bf16():
        assert "unpacked weights" in caplog.text
    reference = minilm_script.ScriptedMiniLMEncoder(workers=1, dtype="bfloat16", pack_weights=False)
    np.testing.assert_array_equal(encoder.encode(PAIRS), reference.encode(PAIRS))


def test_auto_runtime_picks_torchscript_bf16_only_on_cpus_with_native_bf16() -> None:
    from classifiers.encoders import resolve_runtime
    from classifiers.encoders.minilm import cpu_has_native_bf16
    from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder
    from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

    assert resolve_runtime("onnx") == "onnx" and resolve_runtime("torchscript") == "torchscript"
    encoder = load_encoder("minilm", runtime="auto", dtype="auto", threads=1)
    if cpu_has_native_bf16():
        assert isinstance(encoder, ScriptedMiniLMEncoder) and encoder.dtype == "bfloat16"
    else:
        assert isinstance(encoder, OnnxMiniLMEncoder)
    # "auto" never turns on the batched torch path's bf16 (its vectors move with their batch-mates).
    from classifiers.encoders.minilm import MiniLMEncoder

    torch_auto = load_encoder("minilm", runtime="torch", dtype="auto")
    assert isinstance(torch_auto, MiniLMEncoder) and torch_auto.dtype == "float32"


@pytest.mark.parametrize(
    ("flags", "runtime"),
    [({"avx2", "amx_bf16", "avx512_bf16"}, "torchscript"), ({"avx512f", "avx512_bf16"}, "torchscript"),
     ({"avx2", "avx512f"}, "onnx"), (set(), "onnx")],
)
def test_auto_runtime_follows_the_cpu_flags(
    flags: set[str], runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from classifiers.encoders import minilm, resolve_runtime

    monkeypatch.setattr(minilm, "cpu_flags", lambda: frozenset(flags))
    assert resolve_runtime("auto") == runtime
    assert minilm.resolve_dtype("auto") == ("bfloat16" if runtime == "torchscript" else "float32")


def test_onnx_export_is_cached_and_rebuilt_when_missing(tmp_path: Path) -> None:
    from classifiers.encoders.minilm import bundled_model_dir
    from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder, onnx_path_for

    target = onnx_path_for(bundled_model_dir(), tmp_path)
    assert not target.exists()
    first = OnnxMiniLMEncoder(cache_dir=tmp_path)
    assert first.onnx_path == target and target.is_file()
    assert not list(target.parent.glob("*.tmp")), "no half-written export may stay behind"
    mtime = target.stat().st_mtime_ns
    second = OnnxMiniLMEncoder(cache_dir=tmp_path)  # reuses the file instead of exporting again
    assert target.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(first.encode(PAIRS[:2]), second.encode(PAIRS[:2]))


def test_minilm_runtime_and_dtype_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="runtime 'tensorrt'"):
        load_encoder("minilm", runtime="tensorrt")
    with pytest.raises(ValueError, match="needs runtime 'torchscript' or 'torch'"):
        load_encoder("minilm", dtype="bfloat16")


def test_onnx_export_falls_back_to_tmp_when_the_cache_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if os.getuid() == 0:
        # root ignores directory permissions; a file where the cache directory should be fails for anyone.
        blocked = tmp_path / "cache"
        blocked.write_text("not a directory")
    else:
        blocked = tmp_path / "cache"
        blocked.mkdir()
        blocked.chmod(0o555)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder

    with caplog.at_level("WARNING", logger="pointsman.encoders"):
        encoder = OnnxMiniLMEncoder(cache_dir=blocked)
    assert encoder.onnx_path.is_relative_to(tmp_path / "tmp")
    assert "POINTSMAN_CACHE_DIR" in caplog.text
    assert encoder.encode(["still works"]).shape == (1, 384)


async def test_cheap_encoders_run_inline_on_the_event_loop_thread(static: Encoder) -> None:
    import threading

    class Recording:
        """The static encoder, recording which thread calls it."""

        id, dim, cheap = static.id, static.dim, True

        def __init__(self) -> None:
            self.threads: set[int] = set()

        def encode(self, texts: Sequence[str]) -> np.ndarray:
            self.threads.add(threading.get_ident())
            return static.encode(texts)

    recording = Recording()
    async with BatchingEncoder(recording) as batcher:
        assert batcher.inline
        vectors = await asyncio.gather(*(batcher.encode(f"text {i}") for i in range(8)))
        np.testing.assert_array_equal(np.vstack(vectors), static.encode([f"text {i}" for i in range(8)]))
        assert recording.threads == {threading.get_ident()}  # no hop to a worker thread
        assert (await batcher.encode("text 0")) is vectors[0]  # still cached
        assert batcher.stats().as_dict()["encoded"] == 8
    assert BatchingEncoder(static).inline and not BatchingEncoder(static, inline=False).inline


# --- BatchingEncoder streaming per-text encoders ------------------------------------------------------


class _Gated:
    """A real per-text encoder whose passes over texts starting with "wait" block until released."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.id, self.dim, self.workers = inner.id, inner.dim, 2
        self.release = __import__("threading").Event()
        self.solo: list[tuple[str, bool]] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.vstack([self.encode_one(t) for t in texts])

    def encode_one(self, text: str, solo: bool = False) -> np.ndarray:
        self.solo.append((text, solo))
        if text.startswith("wait"):
            assert self.release.wait(30), "never released"
        if text.startswith("fail"):
            raise RuntimeError("pass exploded")
        return self.inner.encode_one(text, solo)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("runtime", ["minilm", "scripted_bf16"])
async def test_per_text_runtimes_stream_with_the_same_bits(runtime: str, request: pytest.FixtureRequest) -> None:
    minilm: Encoder = request.getfixturevalue(runtime)
    texts = [f"{text} (variant {i})" for i, text in enumerate(PAIRS * 3)] + ["Explain consensus. " * 60]
    direct = minilm.encode(texts)
    np.testing.assert_array_equal(np.vstack([minilm.encode_one(t) for t in texts]), direct)  # type: ignore[attr-defined]
    async with BatchingEncoder(minilm) as batcher:
        assert batcher.stream
        vectors = await asyncio.gather(*(batcher.encode(t) for t in texts))
        # Streaming changes when a caller resumes, never its vector: decisions replay exactly.
        np.testing.assert_array_equal(np.vstack(vectors), direct)
        stats = batcher.stats()
        assert (stats.misses, stats.encoded, stats.batches) == (len(texts), len(texts), len(texts))
        assert (await batcher.encode(texts[0])) is vectors[0]  # cached like any other
        assert not vectors[0].flags.writeable


async def test_streaming_answers_each_caller_when_its_own_pass_ends(minilm: Encoder) -> None:
    gated = _Gated(minilm)
    async with BatchingEncoder(gated) as batcher:
        assert batcher.stream
        slow = asyncio.create_task(batcher.encode("wait: a long request that is still being encoded"))
        await asyncio.sleep(0)
        # With batches this caller would wait for its batch-mate; streamed, it is answered on its own.
        quick = await asyncio.wait_for(batcher.encode("a short one"), timeout=30)
        np.testing.assert_array_equal(quick, minilm.encode(["a short one"])[0])
        assert not slow.done()
        gated.release.set()
        await asyncio.wait_for(slow, timeout=30)
    # The first text was alone in flight (its pass may use every core); the second was not.
    assert gated.solo == [("wait: a long request that is still being encoded", True), ("a short one", False)]


async def test_streaming_errors_reach_their_caller_only_and_close_waits_for_passes(minilm: Encoder) -> None:
    gated = _Gated(minilm)
    batcher = BatchingEncoder(gated)
    batcher.start()
    with pytest.raises(RuntimeError, match="pass exploded"):
        await batcher.encode("fail: this one")
    assert batcher.stats().encoded == 0  # nothing cached
    fine = await batcher.encode("fine")
    np.testing.assert_array_equal(fine, minilm.encode(["fine"])[0])
    in_flight = asyncio.create_task(batcher.encode("wait: still running at close"))
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # close() waits for the pass it accepted
    gated.release.set()
    await asyncio.wait_for(closing, timeout=30)
    assert (await in_flight).shape == (minilm.dim,)  # accepted work is answered, not dropped
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.encode("new text")


def test_stream_needs_a_per_text_encoder(static: Encoder) -> None:
    with pytest.raises(ValueError, match="cannot stream"):
        BatchingEncoder(static, inline=False, stream=True)
    assert not BatchingEncoder(static).stream
