"""The engine profile: what one replica (one GPU running vLLM) costs per step and how much KV it holds.

Default: Llama-3.1-8B-Instruct in BF16 on one H100-80GB SXM under vLLM V1 (continuous batching,
chunked prefill, automatic prefix caching). Every number is derived from a public figure, as follows.

* **Model shape** (Llama-3.1-8B ``config.json``; fitmygpu.com/models/llama-3.1-8b): 32 layers, 32
  query heads, 8 KV heads, head_dim 128, ~7.5 B non-embedding parameters.
* **KV bytes per token** = 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 B = 128 KiB
  (the same formula and result in the Hugging Face Llama-3.1 blog's memory table: 1k tokens = 0.125 GB).
* **KV capacity** ``kv_tokens`` = 400,000 tokens: 80 GB x 0.9 (vLLM's default
  ``gpu_memory_utilization``) = 72 GB, minus 16.1 GB of BF16 weights and ~3-4 GB of activations and
  CUDA graphs leaves ~52 GB, / 128 KiB = ~400k tokens.
* **Step base** ``step_base_s`` = 6.5 ms: a decode step must read all 16 GB of weights (16.1 GB / 3.35 TB/s
  = 4.8 ms at peak bandwidth) plus scheduling and sampling; measured TPOT at concurrency 1 is 6.48 ms
  for Llama-3.1-8B on an H100-80GB with vLLM (yobitelcomm.github.io/bench, concurrency sweep recipe).
  On an A100-40GB the same model decodes at ~75 tok/s = 13.3 ms a step (johnmusgrave.com, vLLM sweep).
* **Linear compute per token** ``token_s`` = 35 us, for a prefill token and a decode token alike: 2 x 7.5
  GFLOP / (989 TFLOPS dense BF16 x ~0.45 MFU) = 33.7 us, i.e. ~28k prefill tokens/s. (A100: 312 TFLOPS,
  ~100 us a token; the ``prefill_speed`` sensitivity sweep covers both.)
* **Prefill attention** ``prefill_attn_s`` = 1.2 ns per (query token x earlier position): QK^T and AV cost
  4 x 32 layers x 4096 = 524,288 FLOP per pair, at the same 0.45 MFU. A token at position 30k thus costs
  about twice a token at position 0, so a cache miss on a long context costs more than its length says.
* **Decode attention** ``decode_attn_s`` = 55 ns per context token per decode step: each step re-reads a
  sequence's whole KV, 128 KiB a token, at ~70% of 3.35 TB/s.
* **Scheduler**: ``max_batched_tokens`` = 8192 and ``max_seqs`` = 1024, vLLM V1's defaults for the
  OpenAI server on a >= 70 GB GPU other than an A100 (``EngineArgs.get_batch_defaults`` in
  ``vllm/engine/arg_utils.py``; 2048 and 256 elsewhere). Decode tokens count against the budget, the
  rest goes to prefill chunks, FCFS. ``block_tokens`` = 16 (vLLM's default block size; only full blocks
  are cached and at least the prompt's last token is always recomputed, as in vLLM). The sequence limit
  matters for chat: at 256 a replica's chat goodput is ~12% lower.

Step time = base + token_s x (decode seqs + prefill tokens) + prefill_attn_s x (sum of prefill positions)
+ decode_attn_s x (sum of decoding contexts): the linear-in-tokens model that simulators such as Vidur
and DistServe fit to profiles, with the two attention terms that make long contexts expensive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Costs and limits of one replica. Times in seconds."""

    name: str = "llama-3.1-8b-bf16 / H100-80GB / vLLM V1"
    kv_tokens: int = 400_000
    block_tokens: int = 16
    max_batched_tokens: int = 8192
    max_seqs: int = 1024
    step_base_s: float = 6.5e-3
    token_s: float = 35e-6
    prefill_attn_s: float = 1.2e-9
    decode_attn_s: float = 55e-9

    @property
    def kv_blocks(self) -> int:
        return self.kv_tokens // self.block_tokens

    def scaled(
        self, *, kv: float = 1.0, prefill_speed: float = 1.0, decode_cost: float = 1.0,
    ) -> EngineProfile:
        """A variant for the sensitivity sweep: ``kv`` scales the KV capacity, ``prefill_speed`` divides
        the per-token compute (both linear and attention), ``decode_cost`` multiplies the per-step base
        and the per-context-token decode read (the memory-bound part of a step)."""
        return replace(
            self,
            name=f"{self.name} (kv x{kv:g}, prefill x{prefill_speed:g}, decode x{decode_cost:g})",
            kv_tokens=int(self.kv_tokens * kv),
            token_s=self.token_s / prefill_speed,
            prefill_attn_s=self.prefill_attn_s / prefill_speed,
            step_base_s=self.step_base_s * decode_cost,
            decode_attn_s=self.decode_attn_s * decode_cost,
        )

    def cold_prefill_s(self, tokens: int) -> float:
        """Time an idle replica takes to prefill ``tokens`` with nothing cached (chunked, no decodes)."""
        steps = -(-tokens // self.max_batched_tokens)
        attn = tokens * (tokens - 1) / 2
        return steps * self.step_base_s + tokens * self.token_s + attn * self.prefill_attn_s
