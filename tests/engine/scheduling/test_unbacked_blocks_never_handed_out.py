"""BlockManager over a pool backed from its first block on: pages past the backed count are never handed out."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nvllm.engine.block_manager import BlockManager, IntegrityError, SeqBlocks


@dataclass
class Seq:
    token_ids: list[int]
    block_tables: list[list[int]] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0


def fill(bm: BlockManager, start: int) -> list[SeqBlocks]:
    """Admit one-block sequences until pages run out."""
    seqs: list[SeqBlocks] = []
    while True:
        s = Seq(list(range(start + 4 * len(seqs), start + 4 * len(seqs) + 4)))
        if not bm.admit(s, bm.lookup(s), len(s.token_ids)):
            return seqs
        seqs.append(s)


def test_only_the_backed_blocks_are_offered_until_more_are_added() -> None:
    bm = BlockManager(16, 4, backed_blocks=5)
    assert (bm.num_blocks, bm.num_backed_blocks, bm.num_free_blocks, bm.num_used_blocks) == (16, 5, 5, 0)
    first = fill(bm, 0)
    assert len(first) == 5 and {b for s in first for b in s.block_tables[0]} == set(range(5))
    assert not bm.can_allocate(1)
    bm.check_integrity(first)

    assert bm.add_backed(9) == 4
    assert bm.add_backed(7) == 0, "the count never goes back"
    more = fill(bm, 100)
    assert {b for s in more for b in s.block_tables[0]} == set(range(5, 9))
    bm.check_integrity(first + more)

    for s in first + more:
        bm.free(s)
    bm.check_integrity([])
    assert bm.num_free_blocks == bm.num_backed_blocks == 9, "after all requests end, free + cached = backed"
    assert bm.add_backed(99) == 7 and bm.num_backed_blocks == 16
    assert len(fill(bm, 200)) == 16, "every page, cached ones evicted, once all are backed"


def test_a_page_past_the_backed_ones_in_the_books_fails_the_check() -> None:
    bm = BlockManager(8, 4, backed_blocks=4)
    bm.free_ids.append(6)
    with pytest.raises(IntegrityError, match="past the 4 backed"):
        bm.check_integrity()


def test_without_a_count_the_whole_pool_is_backed() -> None:
    bm = BlockManager(8, 4)
    assert bm.num_backed_blocks == 8 and bm.num_free_blocks == 8
    assert bm.add_backed(8) == 0
