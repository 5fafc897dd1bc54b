"""A replica's KV cache: a radix tree of conversation segments, cached in fixed blocks, LRU-evicted.

What it models (vLLM's automatic prefix caching / SGLang's radix cache): a request's prompt is a path
of segments (system prompt, user message, tool call, tool result, ...); a segment's position is fixed
by what precedes it, so a segment id identifies a prefix. Block ``b`` covers tokens ``[b*B, (b+1)*B)``
and belongs to the segment its last token falls in; a node caches a prefix of the blocks it owns
(``cached <= owned``), and only full blocks are cached. A prompt hits the longest prefix of cached
blocks along its path.

Why a tree of segments and not a table of blocks: a 30k-token agent turn is ~2,000 vLLM blocks but only
~25 segments, so matching, pinning and inserting cost O(segments) per request, which keeps a run of
tens of thousands of requests to seconds. Block granularity is kept for the cached length.

Memory: ``capacity`` blocks = tree blocks + private blocks (reserved by admitted requests for their
uncached prompt and their output). Nodes on a running request's path are pinned; unpinned nodes are
evictable, least recently used first and leaves first (a node's tail blocks go before its parent's,
as vLLM frees a sequence's blocks in reverse so the tail is evicted first).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

#: A prompt path entry: (segment id, blocks the segment owns at its position).
PathEntry = tuple[int, int]


class Node:
    """One segment at one position: ``owned`` blocks end in it, the first ``cached`` of them are held."""

    __slots__ = ("alive", "cached", "children", "last", "owned", "parent", "ref", "uid")

    def __init__(self, uid: int, parent: Node | None, owned: int) -> None:
        self.uid = uid
        self.parent = parent
        self.owned = owned
        self.cached = 0
        self.children: dict[int, Node] = {}
        self.ref = 0  # running requests whose path goes through this node
        self.last = 0.0  # last time a request used it (LRU key)
        self.alive = True


class PrefixCache:
    """Radix tree of cached segments with a bounded block budget and leaf-first LRU eviction."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.root = Node(-1, None, 0)
        self.root.ref = 1  # never evicted
        self.tree_blocks = 0
        self.private_blocks = 0
        self.pinned_blocks = 0
        self.evicted_blocks = 0
        self._heap: list[tuple[float, int, Node]] = []  # (last, tiebreak, leaf): lazily validated
        self._tick = itertools.count()

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.tree_blocks - self.private_blocks

    def match(self, path: Sequence[PathEntry]) -> tuple[int, list[Node]]:
        """Blocks of the longest cached prefix of ``path`` and the nodes holding them."""
        node = self.root
        matched = 0
        nodes: list[Node] = []
        for uid, owned in path:
            child = node.children.get(uid)
            if child is None:
                break
            nodes.append(child)
            matched += child.cached
            if child.cached < owned:
                break
            node = child
        return matched, nodes

    def reserve(self, nodes: list[Node], need: int, now: float) -> bool:
        """Pin ``nodes`` and reserve ``need`` private blocks, evicting unpinned blocks if needed; on
        failure (running requests hold too much) change nothing and return False."""
        for node in nodes:
            self._pin(node)
        short = need - self.free_blocks
        if short > 0:
            if short > self.tree_blocks - self.pinned_blocks:
                for node in nodes:
                    self._unpin(node)
                return False
            self._evict(short)
        for node in nodes:
            node.last = now
        self.private_blocks += need
        return True

    def insert(self, path: Sequence[PathEntry], nodes: list[Node], now: float) -> int:
        """The prompt ``path`` is fully computed: cache all its full blocks. ``nodes`` (the pinned
        matched prefix) is extended in place with the nodes added, which are pinned too. Returns the
        blocks that became cached (a concurrent request may have cached some of them already)."""
        node = self.root
        added = 0
        for i, (uid, owned) in enumerate(path):
            if i < len(nodes):
                child = nodes[i]
            else:
                existing = node.children.get(uid)
                if existing is None:
                    existing = Node(uid, node, owned)
                    node.children[uid] = existing
                child = existing
                self._pin(child)
                nodes.append(child)
            if child.cached < owned:
                grow = owned - child.cached
                child.cached = owned
                self.tree_blocks += grow
                self.pinned_blocks += grow  # pinned: the request holds it
                added += grow
            child.last = now
            node = child
        return added

    def finish(self, nodes: list[Node], out_uid: int, out_owned: int, release: int, now: float) -> None:
        """A request finished: cache its output (a child of its prompt's last node), unpin its path
        and give back its remaining ``release`` private blocks."""
        parent = nodes[-1] if nodes else self.root
        if out_owned > 0 and out_uid not in parent.children:
            out = Node(out_uid, parent, out_owned)
            out.cached = out_owned
            out.last = now
            parent.children[out_uid] = out
            self.tree_blocks += out_owned
            heapq.heappush(self._heap, (now, next(self._tick), out))
        self.private_blocks -= release
        for node in reversed(nodes):
            node.last = now
            self._unpin(node)

    def release_private(self, blocks: int) -> None:
        self.private_blocks -= blocks

    def _pin(self, node: Node) -> None:
        node.ref += 1
        if node.ref == 1:
            self.pinned_blocks += node.cached

    def _unpin(self, node: Node) -> None:
        node.ref -= 1
        if node.ref == 0:
            self.pinned_blocks -= node.cached
            if not node.children:
                heapq.heappush(self._heap, (node.last, next(self._tick), node))

    def _evict(self, short: int) -> None:
        heap = self._heap
        root = self.root
        while short > 0:
            if not heap:
                raise RuntimeError("KV accounting error: nothing left to evict")
            last, _, node = heapq.heappop(heap)
            if not node.alive or node.ref or node.children or node.last != last:
                continue  # stale entry: used, pinned or given children since it was queued
            take = min(node.cached, short)
            node.cached -= take
            self.tree_blocks -= take
            self.evicted_blocks += take
            short -= take
            if node.cached == 0:
                node.alive = False
                parent = node.parent
                assert parent is not None
                del parent.children[node.uid]
                if parent is not root and parent.ref == 0 and not parent.children:
                    heapq.heappush(heap, (parent.last, next(self._tick), parent))
            else:
                heapq.heappush(heap, (node.last, next(self._tick), node))
