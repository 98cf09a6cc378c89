"""The books of the page pool: a free list, reference counts, block tables and the prefix cache.

A page is in exactly one of three states: free (no owner, no content worth keeping), cached (no owner,
but holding a full block whose hash is known, so a later prompt with the same prefix can reuse it;
evicted least-recently-used when free pages run out) or owned (ref_count > 0). The pool arrays
themselves live in model/kv_cache.py.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Protocol

import numpy as np


class SeqBlocks(Protocol):
    token_ids: list[int]
    block_table: list[int]
    num_computed_tokens: int


class IntegrityError(AssertionError):
    pass


def block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """A block's identity: its tokens and everything before them, through the parent's hash."""
    return hashlib.blake2b(parent + np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()   # cached pages, least recently used first
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.num_prefix_queries = 0   # prompt tokens looked up in the prefix cache
        self.num_prefix_hits = 0      # of those, tokens served from it

    # -- counts -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Pages that can be handed out now: truly free plus evictable cached ones."""
        return len(self.free_ids) + len(self.evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------
    def _chain_hashes(self, token_ids: list[int], num_blocks: int) -> list[bytes]:
        hashes, parent, bs = [], b"", self.block_size
        for i in range(num_blocks):
            parent = block_hash(parent, token_ids[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    def _lookup(self, token_ids: list[int]) -> list[int]:
        """Cached pages holding the longest run of full leading blocks, leaving the last token to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits = []
        for i, h in enumerate(self._chain_hashes(token_ids, (len(token_ids) - 1) // bs)):
            b = self.hash_to_block.get(h)
            # Verified: a hash match is taken only when the tokens match too.
            if b is None or self.block_tokens[b] != tuple(token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(b)
        return hits

    # -- allocation ---------------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def _take_free(self) -> int:
        if self.free_ids:
            b = self.free_ids.popleft()
        else:
            b, _ = self.evictable.popitem(last=False)   # evict the least recently used cached page
            self._forget(b)
        self.ref_counts[b] = 1
        return b

    def _forget(self, b: int) -> None:
        h = self.block_hashes[b]
        if h is not None and self.hash_to_block.get(h) == b:
            del self.hash_to_block[h]
        self.block_hashes[b] = None
        self.block_tokens[b] = None

    def admit(self, seq: SeqBlocks, record: bool = True) -> int:
        """Give a sequence with no pages its cached prefix; returns the number of tokens reused.

        The sequence's later tokens get pages through ensure_slots as they are scheduled.
        """
        assert not seq.block_table, "admit() takes a sequence without pages"
        hits = self._lookup(seq.token_ids)
        for b in hits:
            if self.ref_counts[b] == 0:
                del self.evictable[b]
            self.ref_counts[b] += 1
        seq.block_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        if record:
            self.num_prefix_queries += len(seq.token_ids)
            self.num_prefix_hits += seq.num_computed_tokens
        return seq.num_computed_tokens

    def num_new_blocks(self, seq: SeqBlocks, num_tokens: int) -> int:
        """Pages the sequence lacks to hold num_tokens tokens in all."""
        return max(0, self.blocks_needed(num_tokens) - len(seq.block_table))

    def ensure_slots(self, seq: SeqBlocks, num_tokens: int) -> bool:
        """Grow the block table to hold num_tokens tokens; False (and no change) if pages run short."""
        need = self.num_new_blocks(seq, num_tokens)
        if not self.can_allocate(need):
            return False
        seq.block_table.extend(self._take_free() for _ in range(need))
        return True

    def cache_full_blocks(self, seq: SeqBlocks, num_before: int) -> None:
        """After a step computed tokens [num_before, num_computed), register blocks that became full."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        first, last = num_before // bs, seq.num_computed_tokens // bs
        if first >= last:
            return
        parent = self.block_hashes[seq.block_table[first - 1]] if first > 0 else b""
        if parent is None:  # an earlier block was a duplicate kept unhashed: recompute the chain
            parent = self._chain_hashes(seq.token_ids, first)[-1]
        for i in range(first, last):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            parent = block_hash(parent, tokens)
            b = seq.block_table[i]
            if parent in self.hash_to_block:
                continue  # the same content already cached in another page; this one stays private
            self.block_hashes[b] = parent
            self.block_tokens[b] = tokens
            self.hash_to_block[parent] = b

    def free(self, seq: SeqBlocks) -> None:
        """Drop a sequence's pages: shared ones lose a reference, hashed ones stay cached."""
        # Freed in reverse so the tail of a sequence is evicted before its (more shareable) head.
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.block_hashes[b] is not None:
                    self.evictable[b] = None
                else:
                    self.free_ids.append(b)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def fork(self, parent: SeqBlocks, child: SeqBlocks) -> None:
        """Share every page of parent with child (copy-on-write is not needed: pages are append-only
        and a partially filled last page is never shared; the child gets a fresh copy of the slots it
        writes through ensure_slots)."""
        bs = self.block_size
        full = parent.num_computed_tokens // bs
        child.block_table = list(parent.block_table[:full])
        for b in child.block_table:
            self.ref_counts[b] += 1
        child.num_computed_tokens = full * bs

    def reset_prefix_cache(self) -> None:
        for b in list(self.evictable):
            self._forget(b)
            self.free_ids.append(b)
        self.evictable.clear()

    # -- checks -------------------------------------------------------------------------------
    def check_integrity(self, seqs: list[SeqBlocks] | None = None) -> None:
        """Every page is free, cached or owned, exactly once; owners' references add up."""
        free, cached = set(self.free_ids), set(self.evictable)
        def fail(msg: str) -> None:
            raise IntegrityError(msg)
        if len(free) != len(self.free_ids):
            fail("a page is twice in the free list")
        if free & cached:
            fail(f"pages both free and cached: {sorted(free & cached)[:8]}")
        owned = {b for b in range(self.num_blocks) if self.ref_counts[b] > 0}
        if owned & (free | cached):
            fail(f"pages both owned and free/cached: {sorted(owned & (free | cached))[:8]}")
        if len(free) + len(cached) + len(owned) != self.num_blocks:
            lost = set(range(self.num_blocks)) - free - cached - owned
            fail(f"pages neither free, cached nor owned: {sorted(lost)[:8]}")
        if any(r < 0 for r in self.ref_counts):
            fail("a negative reference count")
        for b in cached:
            if self.block_hashes[b] is None or self.hash_to_block.get(self.block_hashes[b]) != b:
                fail(f"cached page {b} is not reachable through its hash")
        for b in free:
            if self.block_hashes[b] is not None:
                fail(f"free page {b} still carries a hash")
        for h, b in self.hash_to_block.items():
            if self.block_hashes[b] != h:
                fail(f"hash map points at page {b}, which holds another block")
        if seqs is not None:
            counts = [0] * self.num_blocks
            for s in seqs:
                for b in s.block_table:
                    counts[b] += 1
            if counts != self.ref_counts:
                bad = [b for b in range(self.num_blocks) if counts[b] != self.ref_counts[b]]
                fail(f"reference counts disagree with block tables at pages {bad[:8]}")
