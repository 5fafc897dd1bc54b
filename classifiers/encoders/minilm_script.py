"""all-MiniLM-L6-v2 written out as a TorchScript module: bfloat16 on CPUs with native bf16, per text, every core.

Why a third runtime for the same model (measured, see bench/README.md "Decision latency"):

- On a CPU with AMX (Intel Sapphire Rapids and later) torch's bfloat16 matrix products run ~3-5x
  faster than float32 ones, and with AVX512-BF16 (AMD Zen 4/5) about 2x; ONNX Runtime's CPU kernels
  have no bfloat16 path. Measured decisions/s at c=32 over onnx float32: ~1.9x on an AMX Xeon,
  ~1.2-1.5x on an AVX512-BF16 EPYC.
- sentence-transformers holds the GIL between its ~200 torch ops per pass, so two copies on two
  threads ran no faster than one. A scripted module runs the whole pass in TorchScript's C++
  interpreter without the GIL, so worker threads really use every core (2 cores: ~2x one).
- Each text runs alone (batch of one, no padding), so a text's vector never depends on its
  batch-mates (the batched bf16 path moved vectors by ~1e-3 with them) and decisions replay exactly
  on the same machine. bfloat16 vectors sit at cosine >= 0.9998 from float32 ones; the shipped heads
  were checked on them (bench/routing_quality.py: held-out APGR within 0.003 of float32).

The forward pass is BERT's, written out here (embeddings, six post-norm encoder blocks with exact
GELU, mean pooling over the text's word pieces) and loaded straight from the bundled safetensors, so
serving never imports transformers (~5 s of start-up) and nothing is written to disk. This module
imports torch at the top: it is only imported when the torchscript runtime is chosen. Float32 output
equals sentence-transformers' to 2e-7 (tested on texts of 3 to 256 word pieces).
"""


# No `from __future__ import annotations`: TorchScript reads these classes' annotations as live objects.
import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, List, Optional, Union  # noqa: UP035 - TorchScript reads these annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from classifiers.encoders.minilm import MINILM_ID, cpu_has_native_bf16, resolve_dtype
from classifiers.encoders.per_text import PerTextEncoder

log = logging.getLogger("pointsman.encoders")


def can_pack_bf16() -> bool:
    """Whether this torch build has oneDNN's packed linear ops (CPU builds with mkldnn do)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class Linear(nn.Module):
    """``x @ W.T + b`` through ``F.linear`` (oneDNN re-packs W on every call)."""

    weight: Tensor
    bias: Tensor

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(nn.Module):
    """The same product on a weight reordered once into oneDNN's blocked layout.

    ``F.linear`` re-packs its weight on every call; for one short text's small matrices that
    dominated the pass (measured on the AMX Xeon: 436 -> 275 us for 66 x 384 x 1536, and the whole
    encoder 98 -> 117 texts/s). bf16 only, and only where the CPU has native bf16.
    """

    weight: Tensor
    bias: Tensor

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        scalars: List[Optional[Union[int, float, complex]]] = []  # noqa: UP006, UP007, UP045
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", scalars, "")


class Block(nn.Module):
    """One post-norm BERT encoder block: self-attention, add & norm, GELU feed-forward, add & norm."""

    ln1_w: Tensor
    ln1_b: Tensor
    ln2_w: Tensor
    ln2_b: Tensor

    def __init__(self, linears: List[nn.Module], norms: List[Tensor], heads: int, eps: float) -> None:  # noqa: UP006
        super().__init__()
        self.query, self.key, self.value, self.attn_out, self.inter, self.out = linears
        self.register_buffer("ln1_w", norms[0])
        self.register_buffer("ln1_b", norms[1])
        self.register_buffer("ln2_w", norms[2])
        self.register_buffer("ln2_b", norms[3])
        self.heads = heads
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dim = x.size(-1)
        head_dim = dim // self.heads
        q = self.query(x).view(1, -1, self.heads, head_dim).transpose(1, 2)
        k = self.key(x).view(1, -1, self.heads, head_dim).transpose(1, 2)
        v = self.value(x).view(1, -1, self.heads, head_dim).transpose(1, 2)
        # One unpadded text: every position attends to every other, so no mask.
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, -1, dim)
        x = F.layer_norm(self.attn_out(attended) + x, [dim], self.ln1_w, self.ln1_b, self.eps)
        hidden = F.gelu(self.inter(x))
        return F.layer_norm(self.out(hidden) + x, [dim], self.ln2_w, self.ln2_b, self.eps)


class MeanPooledBert(nn.Module):
    """Word pieces ``(1, n)`` -> the mean of BERT's last hidden states ``(1, dim)``."""

    word: Tensor
    position: Tensor
    token_type: Tensor
    ln_w: Tensor
    ln_b: Tensor

    def __init__(self, embeddings: List[Tensor], blocks: List[nn.Module], eps: float) -> None:  # noqa: UP006
        super().__init__()
        self.register_buffer("word", embeddings[0])
        self.register_buffer("position", embeddings[1])
        self.register_buffer("token_type", embeddings[2])
        self.register_buffer("ln_w", embeddings[3])
        self.register_buffer("ln_b", embeddings[4])
        self.blocks = nn.ModuleList(blocks)
        self.eps = eps

    def forward(self, input_ids: Tensor) -> Tensor:
        n = input_ids.size(1)
        # Summed in the order transformers sums them (word + segment, then position): same bf16 rounding.
        x = F.embedding(input_ids, self.word) + self.token_type + self.position[:n].unsqueeze(0)
        x = F.layer_norm(x, [x.size(-1)], self.ln_w, self.ln_b, self.eps)
        for block in self.blocks:
            x = block(x)
        return x.mean(1)


def build_module(model_dir: Path, dtype: torch.dtype, pack: bool) -> tuple[Any, int]:
    """Load the bundled BERT weights into a scripted :class:`MeanPooledBert`; returns it and how many
    linear layers were packed."""
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{model_dir} is not a BERT with exact GELU and absolute positions: use runtime onnx")
    stored = load_file(model_dir / "model.safetensors")
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in stored.items()}
    linear = PackedLinear if pack else Linear
    eps = float(config["layer_norm_eps"])

    def lin(prefix: str) -> nn.Module:
        return linear(weights[f"{prefix}.weight"], weights[f"{prefix}.bias"])

    blocks: list[nn.Module] = []
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        linears = [
            lin(f"{p}.attention.self.query"),
            lin(f"{p}.attention.self.key"),
            lin(f"{p}.attention.self.value"),
            lin(f"{p}.attention.output.dense"),
            lin(f"{p}.intermediate.dense"),
            lin(f"{p}.output.dense"),
        ]
        norms = [
            weights[f"{p}.attention.output.LayerNorm.weight"],
            weights[f"{p}.attention.output.LayerNorm.bias"],
            weights[f"{p}.output.LayerNorm.weight"],
            weights[f"{p}.output.LayerNorm.bias"],
        ]
        blocks.append(Block(linears, norms, int(config["num_attention_heads"]), eps))
    embeddings = [
        weights["embeddings.word_embeddings.weight"],
        weights["embeddings.position_embeddings.weight"],
        weights["embeddings.token_type_embeddings.weight"][0],  # one segment: token type 0 throughout
        weights["embeddings.LayerNorm.weight"],
        weights["embeddings.LayerNorm.bias"],
    ]
    module = MeanPooledBert(embeddings, blocks, eps).eval()
    with warnings.catch_warnings():
        # torch 2.13 marks TorchScript deprecated; torch is pinned here and `onnx` is the fallback runtime.
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(module)
    return scripted, 6 * len(blocks) if pack else 0


class ScriptedMiniLMEncoder(PerTextEncoder):
    """all-MiniLM-L6-v2 as a TorchScript module, one text per pass, ``workers`` passes at once.

    Args:
        workers: Texts encoded in parallel on worker threads, each pass on one core.
        dtype: ``"bfloat16"``, ``"float32"`` or ``"auto"`` (bfloat16 where the CPU computes it
            natively: AMX-BF16 or AVX512-BF16).
        model_dir: Override the model directory (default: the bundled one).
        max_tokens: Word pieces read per text (default: the model's 256, as sentence-transformers).
        pack_weights: In bfloat16 on a CPU with native bf16, reorder every linear layer's weight once
            into oneDNN's blocked layout; off only to compare against.

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
        torch.set_num_threads(1)
        self.dtype = resolve_dtype(dtype)
        bf16 = self.dtype == "bfloat16"
        # oneDNN's packed bf16 kernels need native bf16 (AMX or AVX512-BF16); elsewhere F.linear emulates it.
        pack = pack_weights and bf16 and cpu_has_native_bf16() and can_pack_bf16()
        weights_dtype = torch.bfloat16 if bf16 else torch.float32
        try:
            self._module, self.packed_linears = build_module(self.model_dir, weights_dtype, pack)
        except RuntimeError as exc:
            if not pack:
                raise
            # A oneDNN build or CPU variant without the packed bf16 kernels: slower, same model.
            log.warning("packed bf16 linear layers unavailable (%s); MiniLM runs on unpacked weights", exc)
            self._module, self.packed_linears = build_module(self.model_dir, weights_dtype, False)
        self.runtime = f"torchscript {self.dtype}, {workers} worker(s)"
        # TorchScript's profiling executor specialises the graph on its first runs; let that happen
        # here, once, rather than inside the first client requests.
        for length in (4, 32, 128):
            self._pass([101] + [2000] * (length - 2) + [102], False)

    def _pass(self, ids: Sequence[int], solo: bool) -> np.ndarray:
        with torch.inference_mode():  # thread-local: entered on the worker thread that runs the pass
            out = self._module(torch.tensor([list(ids)], dtype=torch.int64))
        return np.asarray(out[0].float().numpy(), dtype=np.float32)
