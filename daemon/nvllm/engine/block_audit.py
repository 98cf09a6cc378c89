"""The page books audited (BlockManager.check_integrity, which the tests call after every step they check):
every backed page free, cached or owned exactly once and no other page any of them, the null page outside
the books, every cached page reachable through its hash, and the owners' references adding up to the
sequences' block tables.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol


class IntegrityError(AssertionError):
    pass


class Books(Protocol):
    """What the audit reads of a BlockManager."""
    null: int
    num_blocks: int
    num_backed_blocks: int
    free_ids: deque[int]
    evictable: OrderedDict[int, None]
    ref_counts: list[int]
    block_hashes: list[bytes | None]
    hash_to_block: dict[bytes, int]
    pending: set[int]

    @property
    def num_reserved(self) -> int: ...


class Tables(Protocol):
    block_tables: list[list[int]]


def audit_books(bm: Books, seqs: Sequence[Tables] | None = None) -> None:
    """Raises IntegrityError at the first rule the books break."""
    free, cached = set(bm.free_ids), set(bm.evictable)
    def fail(msg: str) -> None:
        raise IntegrityError(msg)
    if len(free) != len(bm.free_ids):
        fail("a page is twice in the free list")
    if free & cached:
        fail(f"pages both free and cached: {sorted(free & cached)[:8]}")
    owned = {b for b in range(bm.num_blocks) if bm.ref_counts[b] > 0}
    if 0 <= bm.null < bm.num_blocks and (bm.null in free | cached | owned or bm.ref_counts[bm.null]):
        fail("the null page is in the books")
    if owned & (free | cached):
        fail(f"pages both owned and free/cached: {sorted(owned & (free | cached))[:8]}")
    unbacked = {b for b in free | cached | owned if b >= bm.num_backed_blocks}
    if unbacked:
        fail(f"pages past the {bm.num_backed_blocks} backed ones are in the books: {sorted(unbacked)[:8]}")
    if len(free) + len(cached) + len(owned) + bm.num_reserved != bm.num_backed_blocks:
        lost = set(range(bm.num_backed_blocks)) - free - cached - owned - {bm.null}
        fail(f"pages neither free, cached nor owned: {sorted(lost)[:8]}")
    if any(r < 0 for r in bm.ref_counts):
        fail("a negative reference count")
    for b in cached:
        block_hash = bm.block_hashes[b]
        if block_hash is None or bm.hash_to_block.get(block_hash) != b:
            fail(f"cached page {b} is not reachable through its hash")
    for b in free:
        if bm.block_hashes[b] is not None:
            fail(f"free page {b} still carries a hash")
    if bm.pending - owned:
        fail(f"pages awaiting their step are not owned: {sorted(bm.pending - owned)[:8]}")
    for b in bm.pending:
        if bm.block_hashes[b] is None:
            fail(f"page {b} awaits its step without a hash")
    for h, b in bm.hash_to_block.items():
        if bm.block_hashes[b] != h:
            fail(f"hash map points at page {b}, which holds another block")
    if seqs is not None:
        counts = [0] * bm.num_blocks
        for s in seqs:
            for table in s.block_tables:
                if len(table) != len(s.block_tables[0]):
                    fail("a sequence's block tables differ in length")
                for b in table:
                    if b != bm.null:
                        counts[b] += 1
        if counts != bm.ref_counts:
            bad = [b for b in range(bm.num_blocks) if counts[b] != bm.ref_counts[b]]
            fail(f"reference counts disagree with block tables at pages {bad[:8]}")
