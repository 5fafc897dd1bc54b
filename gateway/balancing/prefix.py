"""Prefix hashes of a conversation: what a replica's KV cache could already hold of it.

An engine (vLLM, SGLang, llama.cpp) reuses the KV cache of the longest prompt prefix it has seen, in
fixed blocks of tokens. Each turn of an agent session repeats the whole conversation so far, so turn
*n+1*'s prompt starts with turn *n*'s. The gateway cannot see tokens; it hashes the request body as the
client sent it, from the ``"messages"`` key on (``"prompt"`` for a legacy completions request), in
fixed blocks of ``block_bytes``, as a chain: ``h_i = xxh3(block_i, seed=h_{i-1})``, so each block's hash
covers everything before it. A client re-sends its history unchanged, so two turns of a session share
every full block of the earlier turn's message list (all but its last, partial block), and the longest
common prefix of two conversations is the last block hash they share — as in vLLM's block hashes.

Why the raw bytes and not a re-rendering of the messages: the body is already in memory, and hashing
it costs ~20 us for a 32k-token conversation on this machine, where re-serialising or walking 200
messages in Python costs ~10x that. Fields before ``"messages"`` (``model`` and friends) are left out:
they may change between turns (the router picks the model) while the conversation does not. What this
gives up: two clients that serialise the same conversation differently (key order, spacing) do not
share blocks — which matters only across clients; a session is one client.

The chain is seeded with the tenant when affinity is partitioned by tenant, so two tenants never
share a block hash: a shared prompt cache is a timing side channel, and the gateway must not steer one
tenant's requests to where another's prefix is cached.
"""

from __future__ import annotations

from typing import NamedTuple

import xxhash

_hash = xxhash.xxh3_64_intdigest

#: Bytes of JSON per token, to turn matched bytes into an estimate of cached tokens (English-like text
#: with BPE tokenizers is ~4 characters a token; JSON punctuation adds a little).
BYTES_PER_TOKEN = 4
_STARTS = (b'"messages"', b'"prompt"')


class PrefixBlocks(NamedTuple):
    """A conversation's chained block hashes; block ``i`` ends ``end(i)`` bytes into the conversation."""

    hashes: list[int]
    block_bytes: int
    total_bytes: int

    def end(self, position: int) -> int:
        """Bytes of conversation up to the end of block ``position`` (negative counts from the last)."""
        if position < 0:
            position += len(self.hashes)
        return min((position + 1) * self.block_bytes, self.total_bytes)

    def last_full(self) -> int:
        """The position of the last block that is a whole ``block_bytes`` long (-1 if none is)."""
        return self.total_bytes // self.block_bytes - 1

    def tokens(self, upto: int = -1) -> int:
        """Estimated tokens of the conversation through block ``upto`` (the whole of it by default)."""
        if not self.hashes or upto < -1:
            return 0
        return self.end(upto) // BYTES_PER_TOKEN


def tenant_seed(tenant: str | None) -> int:
    """The chain seed of a tenant's conversations (0 for no tenant)."""
    return _hash(tenant.encode()) if tenant else 0


def prefix_blocks(raw_body: bytes, *, seed: int = 0, block_bytes: int = 4096) -> PrefixBlocks:
    """The chained block hashes of a request body's conversation (from ``"messages"`` or ``"prompt"``
    on; the whole body when it has neither). Never raises on odd input: it only hashes bytes."""
    start = -1
    for key in _STARTS:
        start = raw_body.find(key)
        if start >= 0:
            break
    view = memoryview(raw_body)[max(start, 0):]
    size = len(view)
    hashes: list[int] = []
    append = hashes.append
    chain = seed
    # The per-block call, not the hashing (~60 GB/s), is the cost: keep this loop bare.
    for offset in range(0, size, block_bytes):
        chain = _hash(view[offset:offset + block_bytes], chain)
        append(chain)
    return PrefixBlocks(hashes, block_bytes, size)
