"""cache.dtype (--kv-cache-dtype): what the page pool stores keys and values in.

auto is f16 for a GGUF and the weights' own float type for a folder; each format keeps the engine's
exactness (a request's greedy tokens do not depend on the batch, on chunking or on the prefix cache);
the pool's bytes, the sizing and the stats follow the format; a format the head size cannot take is
refused by name; and each stays close to f32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.kv_model import hd64_gguf
from nvllm import LLM, SamplingParams, cli
from nvllm.cli.serve import settings_from_args
from nvllm.config import ConfigError, load_settings
from nvllm.engine.assembly import factory
from nvllm.model.quant.kv_format import NAMES

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def hd64(tmp_path_factory) -> str:
    """A GGUF whose heads are 64 wide (q8_0's blocks of 32 divide them)."""
    return str(hd64_gguf(tmp_path_factory.mktemp("kv")))


def _format(path: Path | str, dtype: str = "auto") -> str:
    settings = load_settings(overrides={"model": {"path": str(path)}, "cache": {"dtype": dtype}})
    return factory.read_model_info(settings).kv_format.name


def test_auto_is_f16_for_a_gguf_and_the_weights_float_type_for_a_folder(tiny_models, tiny_ggufs):
    assert _format(tiny_models["tiny-llama"]) == "f32"
    assert _format(tiny_models["tiny-qwen2"]) == "bf16"
    assert _format(tiny_models["tiny-llama-f16"]) == "f16"
    assert {_format(p) for p in tiny_ggufs.values()} == {"f16"}
    assert _format(tiny_models["tiny-qwen2"], "f32") == "f32"          # a setting wins


def test_a_format_the_head_size_cannot_take_is_refused_by_name(tiny_models):
    with pytest.raises(factory.EngineBuildError, match=r"cache.dtype='q8_0'.*head size 24"):
        _format(tiny_models["tiny-qwen3"], "q8_0")
    with pytest.raises(ConfigError, match="cache.dtype"):
        load_settings(overrides={"cache": {"dtype": "fp8"}})


@pytest.mark.parametrize("dtype", NAMES)
def test_each_format_keeps_a_request_s_tokens_whatever_shares_its_steps(hd64, dtype):
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (40, 7, 23)]
    alone = [LLM(hd64, num_blocks=32, max_model_len=128, kv_cache_dtype=dtype,
                 enable_prefix_caching=False).generate([p], GREEDY)[0].token_ids for p in prompts]
    # all three at once, their prompts cut into chunks of 16, a shared prefix served from the cache
    llm = LLM(hd64, num_blocks=32, max_model_len=128, kv_cache_dtype=dtype, max_num_batched_tokens=16)
    assert llm.engine.kv_cache.format.name == dtype
    batched = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    again = llm.generate([prompts[0]], GREEDY)[0]
    assert batched == alone
    assert again.token_ids == alone[0] and again.cached_tokens >= 32
    # too few pages for all three at once: some are preempted and recomputed
    small = LLM(hd64, num_blocks=7, max_model_len=64, kv_cache_dtype=dtype, enable_prefix_caching=False)
    assert [o.token_ids for o in small.generate(prompts, GREEDY)] == alone
    assert small.engine.scheduler.num_preemptions > 0


def test_the_pool_and_the_stats_follow_the_format(hd64):
    engines = {d: LLM(hd64, num_blocks=8, max_model_len=64, kv_cache_dtype=d).engine for d in NAMES}
    f32 = engines["f32"].kv_cache.nbytes
    # q8_0: 34 bytes for 32 values, where f32 takes 128
    assert {d: e.kv_cache.nbytes * 128 // f32 for d, e in engines.items()} == {"f32": 128, "f16": 64, "bf16": 64,
                                                                            "q8_0": 34}
    for d, e in engines.items():
        s = e.stats()
        assert s["kv_cache_dtype"] == d and s["page_bytes"] * 8 == e.kv_cache.nbytes
    settings = load_settings(overrides={"model": {"path": hd64}, "cache": {"dtype": "q8_0"}})
    info = factory.read_model_info(settings)
    # 2 layers x K and V x 2 heads x 64 values in 34-byte blocks of 32
    assert info.bytes_per_token == 2 * 2 * 2 * 68
    assert info.kv_bytes_per_token(engines["f32"].kv_cache.format) == 2 * 2 * 2 * 256


@pytest.mark.usefixtures("keep_int_variant")
def test_every_format_stays_close_to_f32(hd64):
    # on exact activations: 8-bit ones round x coarsely enough that a KV format's last bits move a logit
    # by more than the format itself does (f16: 5e-3 there)
    prompt = [{"prompt_token_ids": list(range(5, 45))}]
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=5)

    def top(dtype: str) -> tuple[list[int], np.ndarray]:
        out = LLM(hd64, num_blocks=8, max_model_len=64, kv_cache_dtype=dtype,
                  activations="exact").generate(prompt, params)[0]
        first = out.logprobs[0].top
        return [t.token_id for t in first], np.array([t.logprob for t in first])

    ids, ref = top("f32")
    for d in ("f16", "bf16", "q8_0"):
        ids_d, lp = top(d)
        assert ids_d[0] == ids[0]
        assert np.abs(lp - ref).max() < {"f16": 2e-3, "bf16": 2e-2, "q8_0": 2e-2}[d]


@pytest.mark.parametrize("command", [["serve"], ["generate", "hello"], ["bench"]])
def test_the_flag_reaches_the_setting(command):
    args = cli.build_parser().parse_args(command + ["--kv-cache-dtype", "q8_0"])
    assert args.kv_cache_dtype == "q8_0"
    if command == ["serve"]:
        assert settings_from_args(args).cache.dtype == "q8_0"
