"""Stopping, in the engine: EOS, stop ids, stop strings across token boundaries, lengths, min_tokens,
streamed deltas, seeds, usage and logprobs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from nvllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_models):
    return LLM(tiny_models["tiny-llama"], num_blocks=128)


PROMPT = {"prompt_token_ids": [5, 17, 99, 250, 31, 7, 480, 12]}


def stream(llm: LLM, prompt, params):
    deltas = []
    final = None
    for _, out in llm.stream([prompt], params):
        deltas.append(out)
        final = out
    return deltas, final


def free_run(llm: LLM, n: int = 24):
    """Greedy output with no stops, and the text each token added."""
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
    pieces = [llm.tokenizer.decode(out.token_ids[:i + 1]) for i in range(len(out.token_ids))]
    return out, pieces


def test_stop_string_spanning_tokens_is_trimmed_and_never_streamed(llm):
    out, pieces = free_run(llm)
    # A stop string that starts inside one token's text and ends inside a later one's.
    k = next(i for i in range(2, len(pieces) - 2)
             if len(pieces[i]) - len(pieces[i - 1]) >= 2 and len(pieces[i + 1]) - len(pieces[i]) >= 1)
    start = len(pieces[k]) - 1
    stop = out.text[start:len(pieces[k + 1])]
    assert len(stop) >= 2
    expected = out.text[:out.text.find(stop)]
    deltas, final = stream(llm, PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]))
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert "".join(d.text for d in deltas) == expected
    assert not any(stop in d.text for d in deltas)

    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                                               include_stop_str_in_output=True))[0]
    assert kept.text == expected + stop


def test_streamed_deltas_concatenate_to_the_final_text(llm):
    deltas, final = stream(llm, PROMPT, SamplingParams(temperature=0.8, seed=3, max_tokens=30, stop=["zzz", "qq"]))
    whole = llm.generate(PROMPT, SamplingParams(temperature=0.8, seed=3, max_tokens=30, stop=["zzz", "qq"]))[0]
    assert "".join(d.text for d in deltas) == whole.text
    assert sum((d.token_ids for d in deltas), []) == whole.token_ids
    assert final.finished and not any(d.finished for d in deltas[:-1])


def test_stop_token_id_ends_with_it_and_says_so(llm):
    out, _ = free_run(llm)
    target = out.token_ids[5]
    got = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                              stop_token_ids=[target]))[0]
    first = out.token_ids.index(target)
    assert got.token_ids == out.token_ids[:first + 1]
    assert got.finish_reason == "stop" and got.stop_reason == target


def test_max_tokens_gives_length(llm):
    got = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))[0]
    assert got.finish_reason == "length" and got.completion_tokens == 7 and len(got.token_ids) == 7
    assert got.prompt_tokens == 8


def test_eos_stops_unless_ignored(tiny_models):
    engine = LLM(tiny_models["tiny-llama"], num_blocks=64).engine
    eos = min(engine.eos_token_ids)
    # Make EOS the greedy choice early: scale up its lm_head row (untied, so only the output changes).
    engine.model.weights.lm_head.array[eos] *= 100
    llm = LLM.from_engine(engine)
    first = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10))[0]
    if first.token_ids[-1] != eos:
        pytest.skip("could not make EOS the greedy choice on this tiny model")
    assert first.finish_reason == "stop" and first.stop_reason is None
    ignored = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 10
    held = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, min_tokens=4))[0]
    assert len(held.token_ids) >= 5 and eos not in held.token_ids[:4]
    assert held.finish_reason == "stop"


def test_min_tokens_holds_off_stop_ids(llm):
    out, _ = free_run(llm)
    target = out.token_ids[0]
    got = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                              stop_token_ids=[target], min_tokens=3))[0]
    assert len(got.token_ids) >= 3 and target not in got.token_ids[:3]


def test_seeded_output_same_alone_and_in_a_batch_of_16(tiny_models):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234, max_tokens=16, ignore_eos=True)
    alone = LLM(tiny_models["tiny-llama"], num_blocks=128).generate(PROMPT, params)[0].token_ids
    rng = np.random.default_rng(1)
    others = [{"prompt_token_ids": rng.integers(3, 500, rng.integers(4, 60)).tolist()} for _ in range(15)]
    mixed = [SamplingParams(temperature=float(t), seed=int(s), max_tokens=16, presence_penalty=0.5)
             for t, s in zip(rng.uniform(0.3, 1.5, 15), rng.integers(0, 1000, 15))]
    # Chunked prefill too: a 16-token budget splits the prompts over steps.
    batched = LLM(tiny_models["tiny-llama"], num_blocks=256, max_num_batched_tokens=16)
    outs = batched.generate(others[:7] + [PROMPT] + others[7:], mixed[:7] + [params] + mixed[7:])
    assert outs[7].token_ids == alone


def test_logprobs_are_reported_per_token(llm):
    got = llm.generate(PROMPT, SamplingParams(temperature=0.7, seed=5, max_tokens=6, logprobs=3))[0]
    assert len(got.logprobs) == len(got.token_ids)
    for tok, lp in zip(got.token_ids, got.logprobs):
        assert lp.token_id == tok and lp.logprob <= 0
        assert 1 <= len(lp.top) <= 3 and all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))


def test_usage_counts_cached_prompt_tokens(llm):
    long = {"prompt_token_ids": list(range(3, 70))}
    llm.generate(long, SamplingParams(temperature=0, max_tokens=2))
    again = llm.generate(long, SamplingParams(temperature=0, max_tokens=2))[0]
    assert again.prompt_tokens == 67 and again.cached_tokens == 64 and again.completion_tokens == 2


def test_cli_generate_takes_sampling_flags_and_streams(tiny_models, tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["hello there", {"prompt_token_ids": [5, 6, 7]},
                                   {"messages": [{"role": "user", "content": "hi"}]}]))
    base = [sys.executable, "-m", "nvllm.cli", "generate", "--model", str(tiny_models["tiny-llama"]),
            "--num-blocks", "64"]
    res = subprocess.run(base + ["--json", "--prompts-file", str(prompts), "--max-tokens", "5",
                                 "--temperature", "0.8", "--seed", "7", "--top-k", "20", "--ignore-eos"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert len(lines) == 3 and all(ln["finish_reason"] == "length" and len(ln["token_ids"]) == 5 for ln in lines)
    again = subprocess.run(base + ["--json", "--prompts-file", str(prompts), "--max-tokens", "5",
                                   "--temperature", "0.8", "--seed", "7", "--top-k", "20", "--ignore-eos"],
                           capture_output=True, text=True, timeout=120)
    assert again.stdout == res.stdout, "a seeded run repeats"
    streamed = subprocess.run(base + ["--stream", "--stats", "--max-tokens", "5", "--ignore-eos", "hello"],
                              capture_output=True, text=True, timeout=120)
    assert streamed.returncode == 0, streamed.stderr
    assert "5 generated" in streamed.stderr and "prefix cache hit rate" in streamed.stderr
    bad = subprocess.run(base + ["--temperature", "-1", "hello"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "temperature" in bad.stderr


def test_cli_generate_stops_at_the_default_bound_unless_asked_for_more(tiny_models, tmp_path):
    """nvllm generate without --max-tokens stops at DEFAULT_MAX_TOKENS (256) and says so on stderr, where
    the API would run to the end of the context (tiny-qwen2's is 512 tokens); --max-tokens N is honoured
    past it, 0 runs to the end of the context, and a prompt that leaves less room than the bound gets what
    it leaves instead of a refusal for a flag it never gave."""
    from nvllm.cli.flags import DEFAULT_MAX_TOKENS

    assert DEFAULT_MAX_TOKENS == 256   # docs/api.md and the flag's help say 256
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["hello", {"prompt_token_ids": [5] * 400}]))
    base = [sys.executable, "-m", "nvllm.cli", "generate", "--model", str(tiny_models["tiny-qwen2"]),
            "--num-blocks", "80", "--ignore-eos", "--json"]

    def run(*args: str) -> tuple[list[dict], str]:
        res = subprocess.run(base + list(args), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [json.loads(ln) for ln in res.stdout.splitlines()], res.stderr

    (short, long), err = run("--prompts-file", str(prompts))
    assert (short["finish_reason"], short["completion_tokens"]) == ("length", DEFAULT_MAX_TOKENS)
    assert (long["finish_reason"], long["completion_tokens"]) == ("length", 512 - 400)
    assert f"stopped at {DEFAULT_MAX_TOKENS} tokens" in err and "--max-tokens 0" in err
    [more], err = run("--max-tokens", "300", "hello")
    assert (more["finish_reason"], more["completion_tokens"]) == ("length", 300) and "stopped at" not in err
    results, err = run("--max-tokens", "0", "--prompts-file", str(prompts))
    assert [r["prompt_tokens"] + r["completion_tokens"] for r in results] == [512, 512] and "stopped at" not in err
    refused = subprocess.run(base + ["--prompts-file", str(prompts), "--max-tokens", str(DEFAULT_MAX_TOKENS)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "max_tokens must be at most 112" in refused.stderr   # asked for: held to it
