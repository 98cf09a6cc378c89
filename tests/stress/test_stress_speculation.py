"""Stress, speculation: a daemon speculating with n-grams on a pool small enough to preempt, under 64
concurrent requests of mixed kinds (repeating prompts that speculate well, seeded sampling with
penalties, stop strings, a regex constraint, opt-outs, three priorities): each answer is the offline
engine's without speculation, every page comes back, and proposals were made and accepted."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, assert_sound, config_with, joined, run_bounded
from nvllm import LLM, SamplingParams
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.stress, pytest.mark.slow]

NUM_REQUESTS = 64   # the streams one client may hold open (server.max_streams_per_client)
NUM_BLOCKS = 64      # 16 running sequences of up to ~110 tokens need more: some are preempted
CONFIG = config_with(BASE_CONFIG, speculative__method="ngram", speculative__disable_by_batch_size=16,
                     speculative__adaptive=False)   # every proposal verified, whatever the step costs


def case(i: int) -> tuple[list[int], dict[str, Any], int]:
    """Request i: prompt ids, sampling parameters, priority."""
    motif = [3 + (i * 7 + j) % 50 for j in range(3 + i % 5)]
    prompt = (motif * 8)[:20 + i % 17] if i % 4 else [5 + (i * 13 + j * 7) % 300 for j in range(24)]
    params: dict[str, Any] = dict(temperature=0.0, max_tokens=24 + i % 60, ignore_eos=True)
    if i % 3 == 1:
        params.update(temperature=0.9, top_p=0.9, seed=100 + i, repetition_penalty=1.1, presence_penalty=0.2)
    if i % 7 == 2:
        params.update(disable_speculation=True)
    if i % 11 == 3:
        params.update(max_tokens=40, ignore_eos=False, structured={"regex": "(ab|cd){2,9}x"})
    if i % 13 == 5:
        params.update(stop=["e"])
    return prompt, params, (-1, 0, 3)[i % 3]


def message(i: int) -> pb.GenerateRequest:
    prompt, params, priority = case(i)
    params = dict(params)
    structured = params.pop("structured", None)
    stop = params.pop("stop", None)
    sp = pb.SamplingParams(**params)
    if stop:
        sp.stop.extend(stop)
    req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=prompt), sampling_params=sp, priority=priority,
                             request_id=f"spec-{i}")
    if structured:
        req.structured.regex = structured["regex"]
    return req


def test_speculation_under_load_with_preemption_and_priorities(tiny: Path, tmp_path: Path, offline,
                                                               reliability) -> None:
    plain = LLM(tiny, num_blocks=256)
    want = [plain.generate([{"prompt_token_ids": case(i)[0]}], SamplingParams(**case(i)[1]))[0]
            for i in range(NUM_REQUESTS)]
    d = DaemonProcess(tmp_path, tiny, CONFIG, num_blocks=NUM_BLOCKS, http_listen="127.0.0.1:0")
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)

                async def one(i: int) -> list[pb.GenerateResponse]:
                    return [r async for r in stub.Generate(message(i), timeout=240)]
                return await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS)))

        results = run_bounded(go(), 300)
        wrong = [i for i, r in enumerate(results) if joined(r) != (want[i].text, want[i].token_ids)]
        assert not wrong, [(i, case(i), joined(results[i]), want[i].token_ids) for i in wrong[:3]]
        text = httpx.get(d.http_url + "/metrics", timeout=30).text
        m = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert m["vllm:spec_decode_num_accepted_tokens_total"] > 0
        assert m["vllm:num_preemptions_total"] > 0
        h = assert_sound(d, offline)
        reliability("speculation", requests=NUM_REQUESTS, equal_to_unspeculated=NUM_REQUESTS - len(wrong),
                    draft_tokens=int(m["vllm:spec_decode_num_draft_tokens_total"]),
                    accepted_tokens=int(m["vllm:spec_decode_num_accepted_tokens_total"]),
                    preemptions=int(m["vllm:num_preemptions_total"]),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        assert d.stop() == 0, d.log()
