"""cache.pinned_prompts: full pages computed at start, held for good, reported as cached; bad files named."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.warm_cache import GREEDY, SYSTEM, assert_clean_but_pinned, engine_llm, pinned_pages, write_prompt
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import EngineBuildError, build_engine


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models["tiny-llama"]


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


SYSTEM_IDS = ids(50, 0)     # three full pages of 16, and two tokens more


def test_a_pinned_prompts_first_request_reports_its_pages_cached(model, tmp_path):
    path = write_prompt(tmp_path / "sys.json", {"prompt_token_ids": SYSTEM_IDS})
    cold = engine_llm(model).generate({"prompt_token_ids": SYSTEM_IDS + [7, 8, 9]}, GREEDY)[0]
    llm = engine_llm(model, pinned_prompts=[path])
    assert len(pinned_pages(llm)) == 3
    out = llm.generate({"prompt_token_ids": SYSTEM_IDS + [7, 8, 9]}, GREEDY)[0]
    assert out.cached_tokens == 48
    assert out.token_ids == cold.token_ids
    assert llm.stats()["pages_pinned"] == 3
    assert_clean_but_pinned(llm)


def test_pinned_pages_survive_pressure_that_evicts_everything_else(model, tmp_path):
    path = write_prompt(tmp_path / "sys.json", {"prompt_token_ids": SYSTEM_IDS})
    llm = engine_llm(model, num_blocks=24, pinned_prompts=[path], scheduler={"max_num_seqs": 4})
    held = list(pinned_pages(llm))
    other = ids(40, 1)
    llm.generate({"prompt_token_ids": other}, GREEDY)
    # Prompts of 5 pages each, 12 of them: the 21 unpinned pages are taken over and over.
    llm.generate([{"prompt_token_ids": ids(80, 10 + i)} for i in range(12)], GREEDY)
    assert pinned_pages(llm) == held
    assert llm.generate({"prompt_token_ids": other}, GREEDY)[0].cached_tokens == 0, "was meant to be evicted"
    assert llm.generate({"prompt_token_ids": SYSTEM_IDS + [3]}, GREEDY)[0].cached_tokens == 48
    assert_clean_but_pinned(llm)


def test_a_system_message_pins_what_a_chat_request_begins_with(model, tmp_path):
    system = {"role": "system", "content": SYSTEM}
    path = write_prompt(tmp_path / "sys.json", {"messages": [system]})
    llm = engine_llm(model, pinned_prompts=[path])
    full = len(llm.engine.warmup.holds[0].prompt.token_ids)
    assert full >= 32
    for question in ("What is the battery level?", "7 waypoints left?"):
        msgs = [system, {"role": "user", "content": question}]
        chat_ids = llm.tokenizer.encode_chat(msgs)
        assert chat_ids[:full] == list(llm.engine.warmup.holds[0].prompt.token_ids)
        assert llm.chat(msgs, GREEDY)[0].cached_tokens == full


def test_two_pinned_prompts_and_a_short_one(model, tmp_path, caplog):
    a = write_prompt(tmp_path / "a.json", {"prompt_token_ids": SYSTEM_IDS})
    b = write_prompt(tmp_path / "b.json", {"prompt": "a reply in French, " * 8})
    short = write_prompt(tmp_path / "short.json", {"prompt": "hi"})
    with caplog.at_level("WARNING", logger="nvllm.engine.pinned"):
        llm = engine_llm(model, pinned_prompts=[a, b, short])
    assert "short.json" in caplog.text and "nothing to pin" in caplog.text
    assert len(llm.engine.warmup.holds) == 2
    assert_clean_but_pinned(llm)


def test_the_pool_makes_room_for_the_pinned_pages(model, tmp_path):
    path = write_prompt(tmp_path / "sys.json", {"prompt_token_ids": ids(200, 2)})   # 12 full pages
    settings = load_settings(overrides={"model": {"path": str(model)}, "scheduler": {"max_model_len": 256},
                                        "cache": {"num_blocks": 20, "pinned_prompts": [path]}})
    with pytest.raises(EngineBuildError, match=r"besides the 12 the pinned prompts hold.*num_blocks to 28"):
        build_engine(settings)
    settings.cache.num_blocks = 28
    engine = build_engine(settings)
    assert engine.block_manager.num_blocks == 28


@pytest.mark.parametrize(("content", "reason"), [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"text": "hello"}', "one key"),
    ('{"prompt": "a", "messages": []}', "one key"),
    ('["a"]', "one key"),
    ('{"prompt_token_ids": [1, "x"]}', "prompt_token_ids"),
    ('{"messages": "hello"}', "messages"),
    ('{"messages": [{"role": "system"}]}', "messages"),
    ('{"prompt": ""}', "empty"),
    ('{"prompt_token_ids": [5]}' .replace("[5]", str([5] * 300)), "too long for max_model_len 256"),
])
def test_a_bad_pinned_file_is_an_error_naming_it(model, tmp_path, content, reason):
    path = tmp_path / "bad-prompt.json"
    if content is not None:
        path.write_text(content)
    settings = load_settings(overrides={"model": {"path": str(model)}, "scheduler": {"max_model_len": 256},
                                        "cache": {"num_blocks": 64, "pinned_prompts": [str(path)]}})
    with pytest.raises(EngineBuildError) as e:
        build_engine(settings)
    msg = str(e.value)
    assert "\n" not in msg and f"cache.pinned_prompts: {path}: " in msg and reason in msg, msg


def test_a_bad_pinned_file_stops_serve_with_one_line(model, tmp_path):
    import subprocess
    import sys

    from helpers.paths import ROOT

    (tmp_path / "nvllm.toml").write_text(f'[cache]\npinned_prompts = ["{tmp_path / "gone.json"}"]\n')
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(model), "--config",
                        str(tmp_path / "nvllm.toml"), "--listen", "127.0.0.1:0", "--num-blocks", "64"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "gone.json: no such file" in r.stderr and "Traceback" not in r.stderr


def test_pinning_needs_the_prefix_cache(model, tmp_path):
    from nvllm.config import ConfigError
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        load_settings(overrides={"cache": {"enable_prefix_caching": False, "pinned_prompts": ["x.json"]}})
