"""The stress group over the HTTP API, bad input (fuzz): thousands of generated request bodies against the
real daemon on loopback, each served or refused naming the parameter.

The same rules as the gRPC stress tests (test_stress_fuzz.py): zero crashes (no 5xx, no ERROR line or
traceback in the daemon's log); every page free or cached at the end and the reference request answered
as before. Figures go to the reliability record (docs/reliability.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, assert_sound, config_with, run_bounded
from nvllm import SamplingParams

pytestmark = [pytest.mark.stress, pytest.mark.slow]

MODEL = "tiny-llama"
VOCAB = 512
MAX_STOP_STRINGS = 4
BATCH = 25
NUM_BATCHES = 80             # 2,000 bodies
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CONFIG = config_with(BASE_CONFIG, max_stop_strings=MAX_STOP_STRINGS, http__max_body_bytes=16384)


# -- bad input -----------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str                     # good, bad, arbitrary
    path: str
    body: bytes
    expect: str = ""              # bad: the parameter the 400 (404 for model) must name
    what: str = ""
    payload: dict | None = None   # good: the JSON, to compare with the offline engine


# At most 20 characters (80 byte tokens at worst), two messages: every good prompt fits max_model_len 256.
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)
SAMPLING = {
    "temperature": st.sampled_from([0, 0.0, 0.5, 1, 1.7]),
    "top_p": st.floats(0.05, 1.0), "top_k": st.integers(-1, 40), "min_p": st.floats(0.0, 0.5),
    "repetition_penalty": st.floats(0.8, 1.5), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "seed": st.integers(0, 2**63), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=MAX_STOP_STRINGS) | st.text(min_size=1, max_size=5),
    "user": st.text(max_size=20), "min_tokens": st.integers(0, 2),
}


@st.composite
def good_payload(draw) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    body: dict[str, Any] = {"max_tokens": draw(st.integers(2, 12))}
    if path == CHAT:
        roles = draw(st.lists(st.sampled_from(["system", "user", "assistant"]), min_size=1, max_size=2))
        body["messages"] = [{"role": r, "content": draw(TEXT) if draw(st.booleans())
                             else [{"type": "text", "text": draw(TEXT)}]} for r in roles]
        if draw(st.booleans()):
            body["logprobs"] = True
            body["top_logprobs"] = draw(st.integers(0, 5))
    else:
        body["prompt"] = draw(TEXT | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30)
                              | st.lists(TEXT, min_size=1, max_size=2))
        if draw(st.booleans()):
            body["logprobs"] = draw(st.integers(0, 5))
    for name in draw(st.sets(st.sampled_from(sorted(SAMPLING)), max_size=6)):
        body[name] = draw(SAMPLING[name])
    if draw(st.integers(0, 3)) == 0:
        body["n"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        body["model"] = MODEL
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    return path, body


# One defect each: (parameter, value); the 400 must name the parameter (404 for model).
DEFECTS: dict[str, st.SearchStrategy] = {
    "temperature": st.sampled_from([-1, "hot", True, [1], {"a": 1}]),
    "top_p": st.sampled_from([0, -0.1, 1.5, "1"]),
    "top_k": st.sampled_from([-2, 1.5, "3"]),
    "min_p": st.sampled_from([-0.1, 1.1]),
    "repetition_penalty": st.sampled_from([0, -1]),
    "presence_penalty": st.sampled_from([2.5, -3]),
    "frequency_penalty": st.sampled_from([2.5, -3]),
    "seed": st.sampled_from([-1, 2**64, 1.5, "7"]),
    "max_tokens": st.sampled_from([0, -5, 10**9, 1.5, "8"]),
    "n": st.sampled_from([0, 17, 1.5, "2"]),
    "stop": st.sampled_from([5, [1], [""], ["a"] * (MAX_STOP_STRINGS + 1), ["x" * 300]]),
    "stream": st.sampled_from(["yes", 1]),
    "logit_bias": st.sampled_from([{"5": 101}, {"five": 1}, {str(VOCAB): 1}, [5]]),
    "suffix": st.just("tail"),
    "unknown": st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=3, max_size=12),
    "model": st.sampled_from(["gpt-4o", "tiny-llama-x", " "]),     # "" is the default model
    "min_tokens": st.just(1000),
    "stop_token_ids": st.sampled_from([[-1], [VOCAB], "1"]),
}


@st.composite
def bad_case(draw) -> Case:
    path, body = draw(good_payload())
    name = draw(st.sampled_from(sorted(DEFECTS)))
    value = draw(DEFECTS[name])
    if name == "unknown":
        name = "x_" + value
        body[name] = 1
    elif name == "suffix" and path == CHAT:
        name, body["echo"] = "echo", True
    else:
        body[name] = value
    if name == "min_tokens":
        body["max_tokens"] = 4
    return Case("bad", path, json.dumps(body).encode(), expect=name, what=name)


@st.composite
def arbitrary_case(draw) -> Case:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    how = draw(st.sampled_from(["bytes", "cut", "json", "huge"]))
    if how == "bytes":
        body = draw(st.binary(max_size=200))
    elif how == "cut":
        _, good = draw(good_payload())
        text = json.dumps(good).encode()
        body = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif how == "json":
        leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
        body = json.dumps(draw(st.recursive(leaf, lambda c: st.lists(c, max_size=4)
                                            | st.dictionaries(st.text(max_size=8), c, max_size=4),
                                            max_leaves=12))).encode()
    else:
        body = b'{"prompt": "' + b"a" * 20000 + b'"}'
    return Case("arbitrary", path, body, what=how)


@st.composite
def good_case(draw) -> Case:
    path, body = draw(good_payload())
    return Case("good", path, json.dumps(body).encode(), payload=body, what=path)


CASES = st.one_of(good_case(), bad_case(), arbitrary_case())


@dataclass
class Outcome:
    status: int
    text: str


async def send_all(client: httpx.AsyncClient, cases: list[Case]) -> list[Outcome]:
    async def one(c: Case) -> Outcome:
        r = await client.post(c.path, content=c.body, headers={"Content-Type": "application/json"})
        return Outcome(r.status_code, r.text)
    return await asyncio.gather(*[one(c) for c in cases])


def _choices_text(case: Case, out: Outcome) -> list[str] | None:
    """The choices' text of a served answer (streamed or whole), or None when malformed."""
    assert case.payload is not None        # a good case: its JSON is kept
    try:
        if case.payload.get("stream"):
            datas = [line[6:] for line in out.text.splitlines() if line.startswith("data: ")]
            if datas[-1] != "[DONE]":
                return None
            texts: dict[int, str] = {}
            for d in datas[:-1]:
                for c in json.loads(d)["choices"]:
                    piece = c.get("text") if case.path == COMPLETIONS else c["delta"].get("content")
                    texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
            return [texts[i] for i in sorted(texts)]
        body = json.loads(out.text)
        return [c["text"] if case.path == COMPLETIONS else c["message"]["content"] for c in body["choices"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


@dataclass
class Tally:
    counts: dict = field(default_factory=lambda: {"tried": 0, "served": 0, "refused": 0, "good": 0, "bad": 0,
                                                  "arbitrary": 0})
    statuses: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    compare: list = field(default_factory=list)       # (payload, path, texts) of greedy or seeded answers

    def check(self, cases: list[Case], outcomes: list[Outcome]) -> None:
        for case, out in zip(cases, outcomes):
            c = self.counts
            c["tried"] += 1
            c[case.kind] += 1
            self.statuses[out.status] = self.statuses.get(out.status, 0) + 1
            why = None
            if out.status >= 500:
                why = f"status {out.status}"
            elif case.kind == "good":
                texts = _choices_text(case, out) if out.status == 200 else None
                if texts is None:
                    why = f"not served: {out.status} {out.text[:300]}"
                else:
                    p = case.payload
                    assert p is not None
                    if p.get("temperature") == 0 or "seed" in p:
                        self.compare.append((case.path, p, texts))
            elif case.kind == "bad":
                want = 404 if case.expect == "model" else 400
                try:
                    err = json.loads(out.text)["error"]
                except (ValueError, KeyError, TypeError):
                    err = {}
                if out.status != want or err.get("param") != case.expect:
                    why = f"expected {want} naming {case.expect}, got {out.status} {out.text[:300]}"
            else:
                if out.status not in (200, 400, 404, 413):
                    why = f"status {out.status}: {out.text[:300]}"
            if why is None:
                c["served" if out.status == 200 else "refused"] += 1
            else:
                self.failures.append(f"{case.kind} ({case.what}): {why}\n{case.body[:500]!r}")


def offline_texts(offline, path: str, p: dict[str, Any]) -> list[str]:
    names = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
             "seed", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "stop", "min_tokens",
             "max_tokens"}
    params = {k: v for k, v in p.items() if k in names}
    if path == CHAT:
        prompts: list[Any] = [{"messages": [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                                             else "\n".join(part["text"] for part in m["content"])}
                                            for m in p["messages"]]}]
    else:
        prompt = p["prompt"]
        prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)
    n = p.get("n", 1)
    out = []
    for prompt in prompts:
        for i in range(n):
            q = dict(params)
            if "seed" in q and i:
                q["seed"] += i
            out.append(offline.generate([prompt], SamplingParams(**q))[0].text)
    return out


def test_http_fuzz_every_body_is_served_or_refused_naming_the_parameter(tiny_models: dict[str, Path],
                                                                        tmp_path: Path, offline, reliability) -> None:
    d = DaemonProcess(tmp_path, tiny_models[MODEL], CONFIG, http_listen="127.0.0.1:0")
    tally = Tally()
    t0 = time.monotonic()
    try:
        @settings(max_examples=NUM_BATCHES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(st.lists(CASES, min_size=BATCH, max_size=BATCH))
        def batch(cases: list[Case]) -> None:
            if tally.failures or d.proc.poll() is not None:
                return

            async def go() -> list[Outcome]:
                async with httpx.AsyncClient(base_url=d.http_url, timeout=120) as client:
                    return await send_all(client, cases)
            tally.check(cases, run_bounded(go()))

        batch()
        assert d.proc.poll() is None, "the daemon died:\n" + d.log()[-4000:]
        assert not tally.failures, f"{len(tally.failures)} wrong answers; the first:\n" + \
            "\n\n".join(tally.failures[:5])
        seconds = time.monotonic() - t0
        for path, payload, texts in tally.compare:
            assert texts == offline_texts(offline, path, payload), (path, payload)
        errors = [line for line in d.lines if line.startswith(("ERROR", "CRITICAL")) or "Traceback" in line]
        assert not errors, "\n".join(errors[:20])
        h = assert_sound(d, offline)
        c = tally.counts
        reliability("http_bad_input", tried=c["tried"], served=c["served"], refused_4xx=c["refused"],
                    other_outcomes=c["tried"] - c["served"] - c["refused"], good=c["good"], bad=c["bad"],
                    arbitrary=c["arbitrary"], statuses={str(k): v for k, v in sorted(tally.statuses.items())},
                    compared_with_offline=len(tally.compare), crashes=0, error_log_lines=len(errors),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached, seconds=round(seconds, 1))
    finally:
        d.stop()
