"""`nvllm serve --dry-run`: one row per KV format (f32, f16, bf16, q8_0) planned from the same reading."""

from __future__ import annotations

import re

import pytest

from helpers.kv_model import hd64_gguf
from nvllm.cli import serve_plan
from nvllm.config import load_settings
from nvllm.engine.assembly import factory

ROW = re.compile(r"^  (\S+) +([\d.]+) bytes a value: (\d+) blocks of (\d+) bytes = [^,]+, (\d+) sequences of "
                 r"(\d+) tokens, resident at most [^;]+; decided by (\S+)", re.M)


def rows(out: str) -> dict[str, tuple[float, int, int, int, str]]:
    return {m[1]: (float(m[2]), int(m[3]), int(m[4]), int(m[5]), m[7]) for m in ROW.finditer(out)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return hd64_gguf(tmp_path_factory.mktemp("kv"))


def test_a_row_per_format_for_a_board(model, capsys) -> None:
    settings = load_settings(overrides={"model": {"path": str(model)},
                                        "scheduler": {"max_model_len": 128, "max_num_seqs": 4}})
    assert serve_plan.dry_run(settings, 8.0) == 0
    got = rows(capsys.readouterr().out)
    assert list(got) == ["f32", "f16", "bf16", "q8_0"]
    info = factory.read_model_info(settings)
    for name, (per_value, blocks, per_block, seqs, bound) in got.items():
        assert per_value == pytest.approx({"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}[name], abs=1e-4)
        assert per_block == info.kv_bytes_per_token(factory.KV_FORMATS[name]) * 16
        # Plenty of memory: each format's pool is what 4 sequences of 128 tokens need.
        assert (blocks, seqs, bound) == (4 * 8, 4, "demand")
    assert got["f16"][2] * 2 == got["f32"][2] and got["q8_0"][2] * 32 == got["f32"][2] // 4 * 34


@pytest.mark.parametrize("hybrid", [True, False])
def test_a_model_of_sliding_layers_counts_its_groups_pages(tiny_models, capsys, hybrid) -> None:
    """tiny-gemma3 (window 8, one global and five sliding layers): given back, a 128-token sequence holds
    8 global pages and at most 8 of each sliding group, and the null page (ModelInfo.blocks_for); kept, 8
    pages of all six layers."""
    settings = load_settings(overrides={"model": {"path": str(tiny_models["tiny-gemma3"])},
                                        "cache": {"hybrid_kv_cache": hybrid, "dtype": "f32"},
                                        "scheduler": {"max_model_len": 128, "max_num_seqs": 4}})
    assert serve_plan.dry_run(settings, 8.0) == 0
    out = capsys.readouterr().out
    blocks, per_block, seqs = rows(out)["f32"][1:4]
    layers = 1 if hybrid else 6
    assert (blocks, seqs) == ((4 * (8 * 6 + 1), 4) if hybrid else (4 * 8, 4))
    assert per_block == layers * 2 * 16 * 2 * 32 * 4   # layers x K,V x 16 tokens x 2 KV heads x 32 dims x f32
    assert ("pages: 6 groups of 1 layers" in out) == hybrid
    longest = 4 * 128 if not hybrid else factory.read_model_info(settings).longest_in(blocks, 16, 512)
    assert f"context: {longest} tokens fit in one sequence" in out


def test_where_memory_decides_the_smaller_formats_hold_more(model, capsys) -> None:
    settings = load_settings(overrides={"model": {"path": str(model)}, "cache": {"max_pool_mb": 1},
                                        "scheduler": {"max_model_len": 128, "max_num_seqs": 4096}})
    assert serve_plan.dry_run(settings, 8.0) == 0
    out = capsys.readouterr().out
    got = rows(out)
    assert got["f32"][4] == "the"  # decided by the cap
    assert got["f32"][1] < got["f16"][1] == got["bf16"][1] < got["q8_0"][1]
    # The main plan printed above the rows is cache.dtype's: auto, f16 for a GGUF.
    assert f"KV page pool: {got['f16'][1]} blocks" in out


def test_a_format_with_no_room_says_so(model, capsys) -> None:
    # A board with room for two 128-token sequences in q8_0, which is not one in f32 (34/32 against 4 bytes).
    info = factory.read_model_info(load_settings(overrides={"model": {"path": str(model)}}))
    q8 = info.kv_bytes_per_token(factory.KV_FORMATS["q8_0"]) * 128
    gib = (info.weight_bytes + (1 << 30) + 2 * q8) / (1 << 30)   # reserve 1 GiB, fraction 0.5
    settings = load_settings(overrides={"model": {"path": str(model)}, "scheduler": {"max_model_len": 128},
                                        "cache": {"dtype": "q8_0"}})
    assert serve_plan.dry_run(settings, gib) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  f32   4 bytes a value: no pool \(page pool too small: .*max_model_len=128", out, re.M)
    assert rows(out)["q8_0"][1] >= 8
