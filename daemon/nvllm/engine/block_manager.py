"""The books of the page pool: a free list, reference counts, block tables and the prefix cache.

A page is in exactly one of three states: free (no owner, no content worth keeping), cached (no owner,
but holding a full block whose hash is known, so a later prompt with the same prefix can reuse it;
evicted least-recently-used when free pages run out) or owned (ref_count > 0). The pool arrays
themselves live in model/kv_cache.py.

The pool's memory may be backed after start-up, from its first block on (engine/assembly/pool_backing.py): only
the first num_backed_blocks pages are ever in the books, and add_backed() brings in more as they are
backed, so a page past them is never handed out and the rest of the manager sees a smaller pool.

As in vLLM v1, a full block is registered in the hash table when it is allocated for the step that
computes it, not after: requests admitted in the same step share it at once.

A pool laid out in groups of layers (model/kv_layout.py: Gemma 3's sliding and global layers) gives each
sequence a block table per group, all as long as its context; a page is owned by one group at a time and
cached under its group's key. A sliding group's pages before its window are given back once no query
will see them again (release_behind_window, vLLM's hybrid allocator): their entries then point at the
null page, a zeroed page never handed out that the kernels skip or mask, and they stay cached, so a
later prompt finds them as long as every page of its last window is still there.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from nvllm.engine.block_audit import IntegrityError as IntegrityError
from nvllm.engine.block_audit import audit_books


class SeqBlocks(Protocol):
    token_ids: list[int]
    block_tables: list[list[int]]   # per group of the pool's layout; [] while it holds no pages
    block_hashes: list[bytes]
    num_computed_tokens: int


def block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """A block's identity: its tokens and everything before them, through the parent's hash."""
    return hashlib.blake2b(parent + np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 backed_blocks: int | None = None, windows: tuple[int, ...] = (0,)) -> None:
        """backed_blocks: how many of the first pages are backed now (None: all); add_backed() adds more.
        windows: per group of the pool's layout, the keys a query sees (0: all)."""
        self.windows = tuple(max(0, int(w)) for w in windows) or (0,)
        # Page 0 is the null page where a group gives pages back; else no entry is ever -1.
        self.null = 0 if any(self.windows) else -1
        self.num_blocks = num_blocks
        self.num_backed_blocks = num_blocks if backed_blocks is None else max(0, min(backed_blocks, num_blocks))
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(b for b in range(self.num_backed_blocks) if b != self.null)
        self.evictable: OrderedDict[int, None] = OrderedDict()   # cached pages, least recently used first
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        # Pages registered in the step being scheduled, whose K/V that step's forward pass writes. Other
        # sequences of the same step may share them (each layer writes the whole step's K/V before any
        # attention reads it); they become cacheable for later steps once mark_computed confirms them.
        self.pending: set[int] = set()
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
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_reserved(self) -> int:
        """Backed pages outside the books: the null page."""
        return int(0 <= self.null < self.num_backed_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_backed_blocks - self.num_reserved - self.num_free_blocks

    def add_backed(self, backed_blocks: int) -> int:
        """The first backed_blocks pages are backed now: the new ones join the free list; how many did."""
        new = range(self.num_backed_blocks, min(backed_blocks, self.num_blocks))
        self.free_ids.extend(b for b in new if b != self.null)
        self.num_backed_blocks += len(new)
        return len(new)

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------
    def _hashes(self, seq: SeqBlocks, num_blocks: int) -> list[bytes]:
        """The sequence's block hashes, extended to num_blocks full blocks; each block is hashed once
        in the sequence's life (tokens are only ever appended, so a hash never goes stale)."""
        hashes, bs = seq.block_hashes, self.block_size
        num_blocks = min(num_blocks, len(seq.token_ids) // bs)
        parent = hashes[-1] if hashes else b""
        for i in range(len(hashes), num_blocks):
            parent = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    def first_kept(self, num_tokens: int, group: int) -> int:
        """The first block a group's queries still see once num_tokens are computed (the next query is at
        position num_tokens and sees keys from num_tokens - window + 1): 0 for a global group."""
        w = self.windows[group]
        return max(0, num_tokens - w + 1) // self.block_size if w else 0

    def _key(self, group: int, h: bytes) -> bytes:
        """A block's key in the hash table: group 0's is its hash (16 bytes), another group's names the group
        in two bytes more (engine/warm/prefix_store.py reads both lengths)."""
        return h if group == 0 else h + group.to_bytes(2, "little")

    def _cached(self, seq: SeqBlocks, group: int, i: int) -> int | None:
        """The page caching the sequence's block i for group, if any (hashes made already)."""
        b = self.hash_to_block.get(self._key(group, seq.block_hashes[i]))
        bs = self.block_size
        # Verified: a hash match is taken only when the tokens match too.
        if b is None or self.block_tokens[b] != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
            return None
        return b

    def lookup(self, seq: SeqBlocks) -> list[list[int]]:
        """Per group, the pages holding the longest run of the sequence's full leading blocks found in
        every group (a sliding group needs only the blocks of the run's last window: the others are the
        null page), leaving the last token to compute. Changes nothing but the hashes kept on the sequence."""
        G = self.num_groups
        if not self.enable_prefix_caching:
            return [[] for _ in range(G)]
        n = (len(seq.token_ids) - 1) // self.block_size
        self._hashes(seq, n)
        found: list[list[int]] = [[] for _ in range(G)]
        for g, w in enumerate(self.windows):   # a global group: its leading run
            if not w:
                while len(found[g]) < n and (b := self._cached(seq, g, len(found[g]))) is not None:
                    found[g].append(b)
                n = len(found[g])
        sliding = [g for g, w in enumerate(self.windows) if w]
        if not sliding:
            return [run[:n] for run in found]
        # run[i]: blocks cached in every sliding group in a row, ending with block i - 1
        run = [0] * (n + 1)
        for i in range(n):
            run[i + 1] = run[i] + 1 if all(self._cached(seq, g, i) is not None for g in sliding) else 0
        n = next((m for m in range(n, 0, -1)
                  if all(run[m] >= m - self.first_kept(m * self.block_size, g) for g in sliding)), 0)
        for g in sliding:
            first = self.first_kept(n * self.block_size, g)
            found[g] = [self.null] * first + [self._cached(seq, g, i) for i in range(first, n)]  # type: ignore[misc]
        return [r[:n] for r in found]

    def _register(self, seq: SeqBlocks, num_tokens: int) -> None:
        """Make findable the blocks that are full once the sequence's first num_tokens are computed."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        # Only blocks of tokens the sequence holds: proposed tokens a step verifies are not its own yet.
        first, last = seq.num_computed_tokens // bs, min(num_tokens, len(seq.token_ids)) // bs
        if first >= last:
            return
        hashes = self._hashes(seq, last)
        for g, table in enumerate(seq.block_tables):
            for i in range(first, last):
                b, key = table[i], self._key(g, hashes[i])
                if self.block_hashes[b] is not None or key in self.hash_to_block:
                    continue  # already findable, or the same content is in another page: this one stays private
                self.block_hashes[b] = key
                self.block_tokens[b] = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                self.hash_to_block[key] = b
                self.pending.add(b)

    def mark_computed(self, seq: SeqBlocks, num_before: int) -> None:
        """After a step computed tokens [num_before, num_computed) without error, the pages it registered
        hold their K/V: they may stay cached once the sequence frees them."""
        if not self.pending:
            return
        bs = self.block_size
        for table in seq.block_tables:
            for b in table[num_before // bs:seq.num_computed_tokens // bs]:
                self.pending.discard(b)

    def settle(self, seq: SeqBlocks, num_before: int) -> None:
        """After a step that verified proposed tokens: of the slots it took, the sequence keeps those of
        its tokens (the first num_computed computed, the last to compute next). Blocks the accepted
        tokens filled become findable; the pages past its tokens, which held only rejected proposals'
        K/V, go back to the free list."""
        computed = seq.num_computed_tokens
        seq.num_computed_tokens = num_before
        self._register(seq, computed)
        seq.num_computed_tokens = computed
        self.mark_computed(seq, num_before)
        keep = self.blocks_needed(len(seq.token_ids))
        for table in seq.block_tables:
            while len(table) > keep:
                b = table.pop()
                self.ref_counts[b] -= 1
                assert self.ref_counts[b] == 0 and self.block_hashes[b] is None, "a proposal's page is private"
                self.free_ids.append(b)
        self.release_behind_window(seq)

    def release_behind_window(self, seq: SeqBlocks) -> None:
        """Give back each sliding group's pages before what its next query sees (once a step's tokens are
        computed): shared ones lose a reference, hashed ones stay cached."""
        for g, table in enumerate(seq.block_tables):
            i = self.first_kept(seq.num_computed_tokens, g) - 1
            while i >= 0 and table[i] != self.null:
                self._drop(table[i])
                table[i] = self.null
                i -= 1

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
        self.pending.discard(b)

    def admit(self, seq: SeqBlocks, hits: list[list[int]], num_tokens: int, record: bool = True) -> bool:
        """Give a sequence with no pages its cached prefix `hits` (from lookup: per group) and pages to
        hold num_tokens tokens in all; False, and nothing changed, if pages run short.

        Only an admission that succeeds counts in the prefix-cache statistics (when `record`).
        """
        assert not seq.block_tables, "admit() takes a sequence without pages"
        assert len(hits) == self.num_groups, "lookup gives a run of pages per group"
        pages = [b for run in hits for b in run if b != self.null]
        reclaimed = sum(1 for b in pages if self.ref_counts[b] == 0)   # cached pages this takes off the free count
        new = (self.blocks_needed(num_tokens) - len(hits[0])) * self.num_groups
        if not self.can_allocate(new + reclaimed):
            return False
        for b in pages:   # before taking free pages, so that none of the hits is evicted for them
            if self.ref_counts[b] == 0:
                del self.evictable[b]
            self.ref_counts[b] += 1
        seq.block_tables = [list(run) for run in hits]
        seq.num_computed_tokens = len(hits[0]) * self.block_size
        if record:
            self.num_prefix_queries += len(seq.token_ids)
            self.num_prefix_hits += seq.num_computed_tokens
        ok = self.ensure_slots(seq, num_tokens)
        assert ok, "pages were counted above"
        return True

    def num_new_blocks(self, seq: SeqBlocks, num_tokens: int) -> int:
        """Pages the sequence lacks to hold num_tokens tokens in all (in every group)."""
        have = len(seq.block_tables[0]) if seq.block_tables else 0
        return max(0, self.blocks_needed(num_tokens) - have) * self.num_groups

    def ensure_slots(self, seq: SeqBlocks, num_tokens: int) -> bool:
        """Grow the block tables to hold num_tokens tokens, the first num_tokens to be computed this step,
        and register the blocks that step fills; False (and no change) if pages run short."""
        need = self.num_new_blocks(seq, num_tokens)
        if not self.can_allocate(need):
            return False
        if not seq.block_tables:
            seq.block_tables = [[] for _ in self.windows]
        for table in seq.block_tables:
            table.extend(self._take_free() for _ in range(need // self.num_groups))
        self._register(seq, num_tokens)
        return True

    def _drop(self, b: int) -> None:
        """One owner less for page b: unowned, it is cached if hashed, else free."""
        self.ref_counts[b] -= 1
        if self.ref_counts[b] == 0:
            if b in self.pending:
                self._forget(b)   # its step never ran (it failed): the K/V may be missing
            if self.block_hashes[b] is not None:
                self.evictable[b] = None
            else:
                self.free_ids.append(b)

    def free(self, seq: SeqBlocks) -> None:
        """Drop a sequence's pages: shared ones lose a reference, computed hashed ones stay cached."""
        # Freed in reverse so the tail of a sequence is evicted before its (more shareable) head.
        for table in seq.block_tables:
            for b in reversed(table):
                if b != self.null:
                    self._drop(b)
        seq.block_tables = []
        seq.num_computed_tokens = 0

    def fork(self, parent: SeqBlocks, child: SeqBlocks) -> None:
        """Share every page of parent with child (copy-on-write is not needed: pages are append-only
        and a partially filled last page is never shared; the child gets a fresh copy of the slots it
        writes through ensure_slots). Where the parent's sliding groups gave back pages the child's next
        query would see, the child shares fewer blocks and computes the rest."""
        bs = self.block_size
        full = parent.num_computed_tokens // bs
        while full and any(t[self.first_kept(full * bs, g)] == self.null
                           for g, t in enumerate(parent.block_tables) if self.first_kept(full * bs, g) < full):
            full -= 1
        child.block_tables = [t[:full] for t in parent.block_tables]
        for table in child.block_tables:
            for b in table:
                if b != self.null:
                    self.ref_counts[b] += 1
        child.num_computed_tokens = full * bs

    def add_cached(self, h: bytes, tokens: tuple[int, ...], write: Callable[[int], None]) -> int | None:
        """Put a block computed elsewhere (the persisted cache, engine/warm/prefix_store.py) in a free page:
        write(page) fills its K/V, then it is cached, findable by h. None, and nothing changed, when the
        block is cached already or no page is free (none is evicted for it)."""
        if not self.enable_prefix_caching or h in self.hash_to_block or not self.free_ids:
            return None
        b = self.free_ids.popleft()
        try:
            write(b)
        except BaseException:
            self.free_ids.appendleft(b)
            raise
        self.block_hashes[b], self.block_tokens[b], self.hash_to_block[h] = h, tokens, b
        self.evictable[b] = None
        return b

    def reset_prefix_cache(self) -> None:
        for b in list(self.evictable):
            self._forget(b)
            self.free_ids.append(b)
        self.evictable.clear()

    # -- checks -------------------------------------------------------------------------------
    def check_integrity(self, seqs: list[SeqBlocks] | None = None) -> None:
        """Every backed page is free, cached or owned, exactly once, and no other page is any of them;
        owners' references add up (block_audit.py; IntegrityError names the first broken rule)."""
        audit_books(self, seqs)
