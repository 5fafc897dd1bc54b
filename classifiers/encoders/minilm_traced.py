"""all-MiniLM-L6-v2 traced with TorchScript: bfloat16 on CPUs with AMX, per text, on every core.

Why a third runtime for the same model (measured, see bench/README.md "Decision latency"):

- On a CPU with AMX (Intel Sapphire Rapids and later) torch's bfloat16 matrix multiplications run
  ~3-5x faster than float32 ones; ONNX Runtime's CPU kernels have no bfloat16 path.
- The sentence-transformers module holds the GIL between its ~200 torch ops per pass, so two copies
  on two threads ran no faster than one. A traced module runs the whole pass in TorchScript's C++
  interpreter without the GIL, so worker threads really use every core (2 cores: 1.9-2x one).
- Each text runs alone (batch of one, no padding), so a text's vector never depends on its
  batch-mates (the batched bf16 path moved vectors by ~1e-3 with them) and decisions replay exactly
  on the same machine. bfloat16 vectors sit at cosine >= 0.9999 from float32 ones; the shipped heads
  were checked on them (bench/routing_quality.py: held-out APGR within 0.003 of float32).

The trace is built at start-up from the bundled safetensors weights (~2 s, offline); nothing is
written to disk.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, List, Optional, Union  # noqa: UP035 - TorchScript reads these annotations

import numpy as np

from classifiers.encoders.minilm import MINILM_ID, cpu_has_native_bf16, quiet_transformers, resolve_dtype
from classifiers.encoders.per_text import PerTextEncoder

# Traced with a short text; the trace is shape-generic (checked against sentence-transformers on
# texts of 3 to 256 word pieces in tests/classifiers/test_encoders.py).
_EXAMPLE_IDS = [101, 2129, 2116, 1054, 1005, 1055, 2024, 1999, 13137, 1029, 102]


def _packed_linear_class(torch: Any) -> Any:
    """A bfloat16 ``nn.Linear`` whose weight is reordered once into oneDNN's blocked layout.

    ``nn.Linear`` (``addmm``) re-packs its weight on every call; for the small matrices of one short
    text that dominated the pass (measured on the AMX Xeon: 436 -> 275 us for 66 x 384 x 1536). The
    result is bit-identical to ``addmm``'s (tested through the whole model). Scripted, because the
    tracer cannot record the op's empty ``Scalar?[]`` argument.
    """

    class PackedLinear(torch.nn.Module):
        def __init__(self, linear: Any) -> None:
            super().__init__()
            weight = linear.weight.detach()
            self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, None))
            self.register_buffer("bias", linear.bias.detach() if linear.bias is not None else None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scalars: List[Optional[Union[int, float, complex]]] = []  # noqa: UP006, UP007, UP045
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", scalars, "")

    return PackedLinear


def pack_linears(module: Any, torch: Any) -> int:
    """Swap every ``nn.Linear`` under ``module`` for a scripted :func:`_packed_linear_class`; returns how many."""
    packed_linear = _packed_linear_class(torch)
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, torch.jit.script(packed_linear(child)))
            swapped += 1
        else:
            swapped += pack_linears(child, torch)
    return swapped


def can_pack_bf16(torch: Any) -> bool:
    """Whether this torch build has oneDNN's packed linear ops (CPU builds with mkldnn do)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class TracedMiniLMEncoder(PerTextEncoder):
    """all-MiniLM-L6-v2 as a TorchScript trace, one text per pass, ``workers`` passes at once.

    Args:
        workers: Texts encoded in parallel on worker threads, each pass on one core.
        dtype: ``"bfloat16"``, ``"float32"`` or ``"auto"`` (bfloat16 where the CPU computes it
            natively: AMX-BF16 or AVX512-BF16).
        model_dir: Override the model directory (default: the bundled one).
        max_tokens: Word pieces read per text (default: the model's 256, as sentence-transformers).
        pack_weights: In bfloat16 on a CPU with native bf16, reorder every linear layer's weight once
            into oneDNN's blocked layout (:func:`pack_linears`); off only to compare against.

    Building one sets torch's intra-op threads to 1 for the process: parallelism comes from the
    workers, and a second intra-op pool would only fight them for the same cores.
    """

    id: str = MINILM_ID
    dim: int = 384

    def __init__(
        self,
        workers: int = 1,
        dtype: str = "auto",
        model_dir: Path | None = None,
        max_tokens: int | None = None,
        pack_weights: bool = True,
    ) -> None:
        super().__init__(workers, model_dir, max_tokens)
        import torch

        self.pack_weights = pack_weights
        self.packed_linears = 0
        torch.set_num_threads(1)
        self.dtype = resolve_dtype(dtype)
        self._torch_dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        self.runtime = f"torchscript {self.dtype}, {workers} worker(s)"
        self._module = self._trace(torch)
        # TorchScript's profiling executor specialises the graph on its first runs; let that happen
        # here, once, rather than concurrently inside the first client requests.
        for length in (4, 32, 128):
            self._pass([101] + [2000] * (length - 2) + [102], False)

    def _trace(self, torch: Any) -> Any:
        from transformers import AutoModel

        with quiet_transformers():
            bert = AutoModel.from_pretrained(str(self.model_dir), local_files_only=True).eval()

        class MeanPooled(torch.nn.Module):
            """BERT + mean pooling over every token: one unpadded text, so no mask is needed."""

            def __init__(self, model: Any) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: Any) -> Any:
                hidden = self.model(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    token_type_ids=torch.zeros_like(input_ids),
                ).last_hidden_state
                return hidden.mean(1)

        module = MeanPooled(bert).to(self._torch_dtype).eval()
        with quiet_transformers(), warnings.catch_warnings(), torch.inference_mode():
            # TracerWarnings about Python booleans in transformers' mask helpers: with no padding
            # those branches are constant, which the shape checks in the tests confirm. torch 2.13
            # also marks TorchScript deprecated; it is pinned, and `onnx` is the fallback runtime.
            warnings.simplefilter("ignore")
            # oneDNN's bf16 kernels need native bf16 (AMX or AVX512-BF16); elsewhere addmm emulates it.
            bf16 = self._torch_dtype == torch.bfloat16
            if self.pack_weights and bf16 and cpu_has_native_bf16() and can_pack_bf16(torch):
                self.packed_linears = pack_linears(module, torch)
            # Not frozen: freezing rewrites the graph for oneDNN's float32 layouts and made bf16 passes
            # 2x slower (measured: 21.6 vs 11.7 ms per RouteLLM prompt).
            return torch.jit.trace(module, torch.tensor([_EXAMPLE_IDS]), check_trace=False)

    def _pass(self, ids: Sequence[int], solo: bool) -> np.ndarray:
        import torch

        with torch.inference_mode():  # thread-local: entered on the worker thread that runs the pass
            out = self._module(torch.tensor([list(ids)], dtype=torch.int64))
        return np.asarray(out[0].float().numpy(), dtype=np.float32)
