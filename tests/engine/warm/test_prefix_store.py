"""cache.persist_dir: the pinned and hottest pages written at drain and read back at start, exactly; any
file that does not match or is damaged is ignored with one log line, and the engine serves as cold."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

from helpers.warm_cache import GREEDY, assert_clean_but_pinned, engine_llm, finish_warmup, pinned_pages, write_prompt
from nvllm.engine.warm import prefix_store
from nvllm.engine.warm.prefix_store import FILE_NAME, MAGIC


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


SYSTEM_IDS = ids(50, 0)
OTHER_IDS = ids(40, 1)        # a prompt not pinned, cached by being asked
QUESTION = {"prompt_token_ids": SYSTEM_IDS + [7, 8, 9]}


@pytest.fixture()
def model(tiny_models, tmp_path):
    """A copy of tiny-llama, so a test may change its files."""
    dst = tmp_path / "tiny-llama"
    shutil.copytree(tiny_models["tiny-llama"], dst)
    return dst


@pytest.fixture()
def cold(model):
    llm = engine_llm(model)
    return [o.token_ids for o in llm.generate([QUESTION, {"prompt_token_ids": OTHER_IDS}], GREEDY)]


def written(model, tmp_path, **cache):
    """An engine that pinned SYSTEM_IDS, was asked OTHER_IDS and saved its cache; the file's path."""
    pinned = write_prompt(tmp_path / "sys.json", {"prompt_token_ids": SYSTEM_IDS})
    store = tmp_path / "store"
    llm = engine_llm(model, pinned_prompts=[pinned], persist_dir=str(store), **cache)
    llm.generate({"prompt_token_ids": OTHER_IDS}, GREEDY)
    llm.engine.warmup.save()
    return store / FILE_NAME, pinned


def restarted(model, tmp_path, pinned, **cache):
    return engine_llm(model, pinned_prompts=[pinned], persist_dir=str(tmp_path / "store"), **cache)


def test_read_back_serves_from_the_cache_with_the_cold_tokens(model, tmp_path, cold, caplog):
    path, pinned = written(model, tmp_path)
    assert path.exists() and not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    with caplog.at_level("INFO", logger="nvllm.engine"):
        llm = restarted(model, tmp_path, pinned)
    assert "pages read back" in caplog.text and "all from the persisted cache" in caplog.text
    computed = llm.stats()["prompt_tokens_computed"]
    assert computed == 0, "the pinned prompt came from the file, not the model"
    outs = llm.generate([QUESTION, {"prompt_token_ids": OTHER_IDS}], GREEDY)
    assert [o.token_ids for o in outs] == cold
    assert [o.cached_tokens for o in outs] == [48, 32]
    assert_clean_but_pinned(llm)


def test_a_model_of_sliding_layers_reads_back_every_groups_pages(tiny_models, tmp_path):
    """tiny-gemma3's pool has six groups of layers (model/kv_layout.py): each group's pages are written under
    its own key and come back, the sliding groups' over the last window, and serve as before."""
    gemma = tiny_models["tiny-gemma3"]
    cold = [o.token_ids for o in engine_llm(gemma, num_blocks=256).generate(
        [QUESTION, {"prompt_token_ids": OTHER_IDS}], GREEDY)]
    _, pinned = written(gemma, tmp_path, num_blocks=256)
    llm = restarted(gemma, tmp_path, pinned, num_blocks=256)
    assert llm.engine.kv_cache.layout.num_groups == 6
    assert llm.stats()["prompt_tokens_computed"] == 0, "the pinned prompt came from the file, not the model"
    outs = llm.generate([QUESTION, {"prompt_token_ids": OTHER_IDS}], GREEDY)
    assert [o.token_ids for o in outs] == cold
    assert [o.cached_tokens for o in outs] == [48, 32]
    assert_clean_but_pinned(llm)


def test_a_request_before_the_load_ends_misses_the_cache_and_is_right(model, tmp_path, cold):
    _, pinned = written(model, tmp_path)
    llm = restarted(model, tmp_path, pinned, warm=False)
    out = llm.generate({"prompt_token_ids": OTHER_IDS}, GREEDY)[0]   # the load is still opening the file
    assert out.token_ids == cold[1] and out.cached_tokens == 0
    finish_warmup(llm)
    assert llm.generate(QUESTION, GREEDY)[0].cached_tokens == 48
    assert_clean_but_pinned(llm)


def test_the_file_is_bounded_pinned_first(model, tmp_path):
    path, pinned = written(model, tmp_path, persist_max_mb=0)
    llm = restarted(model, tmp_path, pinned)
    assert llm.generate({"prompt_token_ids": OTHER_IDS}, GREEDY)[0].cached_tokens == 0, "only the pinned pages"
    assert llm.generate(QUESTION, GREEDY)[0].cached_tokens == 48
    assert path.stat().st_size < 4 * prefix_store.page_bytes(llm.engine.kv_cache) + 4096


def test_a_failed_write_leaves_the_old_file(model, tmp_path, monkeypatch):
    path, pinned = written(model, tmp_path)
    before = path.read_bytes()
    llm = restarted(model, tmp_path, pinned)
    llm.generate({"prompt_token_ids": ids(64, 5)}, GREEDY)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(prefix_store.os, "fsync", broken_fsync)
    llm.engine.warmup.save()    # logged, not raised
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [FILE_NAME]


def flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def change_first_token(path):
    """The first token of the first block, another digit in its place: same length, wrong content."""
    data = bytearray(path.read_bytes())
    at = data.index(b'"blocks":[["') + len(b'"blocks":[["') + 32 + len(b'",[')
    data[at] = ord("1") if data[at] != ord("1") else ord("2")
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-1000]),
    "a page's byte": lambda p: flip(p, p.stat().st_size - 5000),
    "a header token": lambda p: change_first_token(p),
    "the digest": lambda p: flip(p, p.stat().st_size - 1),
    "a huge header length": lambda p: p.write_bytes(MAGIC + struct.pack("<Q", 1 << 62) + p.read_bytes()[16:]),
    "no magic": lambda p: p.write_bytes(b"GGUF" + p.read_bytes()[4:]),
    "empty": lambda p: p.write_bytes(b""),
    "header not JSON": lambda p: flip(p, 16),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_ignored_with_one_line(model, tmp_path, cold, caplog, damage):
    path, pinned = written(model, tmp_path)
    DAMAGE[damage](path)
    with caplog.at_level("INFO", logger="nvllm.engine"):
        llm = restarted(model, tmp_path, pinned)
    lines = [r.getMessage() for r in caplog.records if " ignored: " in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0], caplog.text
    outs = llm.generate([QUESTION, {"prompt_token_ids": OTHER_IDS}], GREEDY)
    assert [o.token_ids for o in outs] == cold
    assert [o.cached_tokens for o in outs] == [48, 0], "pinned by computing it; the rest is cold"
    assert_clean_but_pinned(llm)


def change_model(model):
    st = (model / "model.safetensors").stat()
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.mark.parametrize(("change", "why"), [
    ("weights touched", "another model (files"),
    ("kv dtype", "another KV format (format"),
    ("block size", "another KV format (block_size"),
    ("activations", "another model (activations"),
])
def test_a_file_for_another_model_or_format_is_ignored(model, tmp_path, caplog, keep_int_variant, change, why):
    _, pinned = written(model, tmp_path)
    cache: dict = {}
    overrides: dict = {}
    if change == "weights touched":
        change_model(model)
    elif change == "kv dtype":
        cache["dtype"] = "f16"
    elif change == "block size":
        cache["block_size"] = 8
    with caplog.at_level("INFO", logger="nvllm.engine"):
        if change == "activations":
            from nvllm import LLM
            from nvllm.config import load_settings
            from nvllm.engine.assembly.factory import build_engine
            overrides = {"model": {"path": str(model), "activations": "float"},
                         "cache": {"num_blocks": 64, "pinned_prompts": [pinned],
                                   "persist_dir": str(tmp_path / "store")}}
            llm = LLM.from_engine(build_engine(load_settings(overrides=overrides)))
            finish_warmup(llm)
        else:
            llm = restarted(model, tmp_path, pinned, **cache)
    lines = [r.getMessage() for r in caplog.records if " ignored: " in r.getMessage()]
    assert len(lines) == 1 and why in lines[0], caplog.text
    cold = engine_llm(model, **cache).generate({"prompt_token_ids": OTHER_IDS}, GREEDY)[0].token_ids
    out = llm.generate({"prompt_token_ids": OTHER_IDS}, GREEDY)[0]
    assert out.cached_tokens == 0 and out.token_ids == cold
    assert len(pinned_pages(llm)) == 48 // llm.engine.block_manager.block_size


def test_no_write_while_an_engine_thread_may_still_run(model, tmp_path):
    from nvllm.engine.async_engine import AsyncEngine

    pinned = write_prompt(tmp_path / "sys.json", {"prompt_token_ids": SYSTEM_IDS})
    llm = engine_llm(model, pinned_prompts=[pinned], persist_dir=str(tmp_path / "store"))
    engine = AsyncEngine(llm.engine)
    engine._stuck = True    # as stop_thread leaves it when the thread outlived its timeout
    engine.save_cache()
    assert not (tmp_path / "store").exists()
    engine._stuck = False
    engine.save_cache()
    assert (tmp_path / "store" / FILE_NAME).exists()
