"""KVCache with resident_blocks: the first blocks are resident at once, back_blocks backs the others in
place, and backing never changes a byte of the blocks around it (they may be in use)."""

from __future__ import annotations

import psutil
import pytest

from nvllm.model import kv_cache
from nvllm.model.kv_cache import KVCache

MiB = 1 << 20


def rss() -> int:
    return psutil.Process().memory_info().rss


def test_only_the_first_blocks_are_resident_until_backed() -> None:
    before = rss()
    kv = KVCache(num_layers=4, num_blocks=1024, block_size=16, num_kv_heads=4, head_dim=64,
                 resident_blocks=64)   # 128 KiB a block over all layers: 8 of 128 MiB
    made = rss()
    assert kv.pool.shape == (4, 2, 1024, 16, 4, 64) and not kv.pool.any()
    assert 7 * MiB <= made - before <= 24 * MiB, f"{(made - before) / MiB:.1f} MiB resident for 8 MiB of blocks"
    kv.back_blocks(64, 1024)
    assert rss() - before >= 120 * MiB
    kv.pool[...] = 1.0
    assert rss() - before <= 136 * MiB, "writing the whole pool made no more pages resident"


@pytest.mark.parametrize("way", ["madvise", "touching pages"])
def test_backing_leaves_the_neighbouring_blocks_as_they_are(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if way == "touching pages":
        monkeypatch.setattr(kv_cache._Populate, "usable", False)
    # 1.5 KiB blocks per layer: block edges fall inside pages, shared with the blocks either side.
    kv = KVCache(num_layers=2, num_blocks=64, block_size=4, num_kv_heads=2, head_dim=48, resident_blocks=9)
    kv.pool[:, :, :9] = 7.0
    kv.back_blocks(9, 20)
    kv.pool[:, :, 20:] = 3.0   # blocks past the range, written before their own backing
    kv.back_blocks(20, 64)
    assert (kv.pool[:, :, :9] == 7.0).all() and not kv.pool[:, :, 9:20].any() and (kv.pool[:, :, 20:] == 3.0).all()


def test_a_kernel_without_populate_write_has_its_pages_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    kv = KVCache(num_layers=2, num_blocks=64, block_size=16, num_kv_heads=2, head_dim=64, resident_blocks=8)
    monkeypatch.setattr(kv_cache._Populate, "usable", True)     # restored after the test
    monkeypatch.setattr(kv_cache, "_MADV_POPULATE_WRITE", -1)   # EINVAL, as from a kernel before 5.14
    before = rss()
    kv.back_blocks(8, 64)
    assert not kv_cache._Populate.usable, "it stops asking the kernel"
    assert rss() - before >= 0.9 * 56 * kv.nbytes // 64, "the blocks were backed by touching their pages"
    assert not kv.pool.any()
