"""Stress 1, bad input: thousands of generated GenerateRequests against the real daemon.

Hypothesis draws batches of cases (good, bad, arbitrary: helpers/generate_request_cases.py), each sent
concurrently over one loopback channel as raw bytes (through a generic unary_stream call with an identity
serializer, so that bytes no proto3 library would produce, invalid UTF-8 in a string field, a cut-off
message, reach the daemon too). A good case must be served, and when greedy or seeded its tokens must
equal the offline engine's; a bad one refused with INVALID_ARGUMENT whose message starts with the
defective field's path; an arbitrary one served, or refused naming a field.

Zero crashes: no other status code, no ERROR line or traceback in the daemon's log, the same process
at the end, every page free or cached, and the reference request answered as before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from helpers.daemon_util import BASE_CONFIG, MAX_MESSAGE_BYTES, NUM_BLOCKS, DaemonProcess, assert_sound, config_with
from helpers.generate_request_cases import ANY_FIELD, CASES, MAX_STOP_CHARS, MAX_STOP_STRINGS, MODEL, VOCAB, Case
from nvllm.v1 import nvllm_pb2 as pb

pytestmark = [pytest.mark.stress, pytest.mark.slow]

BATCH = 25
NUM_BATCHES = 204          # 5,100 requests
# What a refusal may name: the request, its input, or any field of the request (tools, structured, ...).
FIELDS = ("request", "input", *pb.GenerateRequest.DESCRIPTOR.fields_by_name)

CONFIG = config_with(BASE_CONFIG, max_stop_strings=MAX_STOP_STRINGS, server__max_stop_string_chars=MAX_STOP_CHARS)


# -- sending ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str = ""
    responses: list | None = None


async def send(call, data: bytes) -> Outcome:
    try:
        responses = [r async for r in call(data, timeout=120)]
    except grpc.aio.AioRpcError as e:
        return Outcome(e.code(), e.details() or "")
    return Outcome(grpc.StatusCode.OK, "", responses)


async def send_all(call, payloads: list[bytes]) -> list[Outcome]:
    return await asyncio.gather(*[send(call, p) for p in payloads])


def served_ok(case: Case, out: Outcome) -> str | None:
    """Why a served answer is wrong, or None."""
    rs = out.responses
    if not rs:
        return "no messages"
    last = rs[-1]
    if last.finish_reason not in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH):
        return f"finish_reason {last.finish_reason}"
    if any(r.finish_reason for r in rs[:-1]):
        return "finish_reason before the last message"
    ids = [t for r in rs for t in r.token_ids]
    if last.usage.completion_tokens != len(ids) or not all(0 <= t < VOCAB for t in ids):
        return f"token ids {ids} vs usage {last.usage}"
    req = case.request
    if req is not None and case.kind == "good":
        sp = req.sampling_params
        if sp.HasField("max_tokens") and len(ids) > sp.max_tokens:
            return f"{len(ids)} tokens > max_tokens {sp.max_tokens}"
        if sp.HasField("logprobs") and sum(len(r.logprobs) for r in rs) != len(ids):
            return "logprobs missing"
        if req.request_id and not all(r.request_id.startswith(req.request_id + "#") for r in rs):
            return "request_id not echoed"
    return None


def refused_ok(case: Case, out: Outcome) -> str | None:
    if case.what == "unknown model":     # a model this daemon does not serve: NOT_FOUND, naming the one it does
        return None if out.code == grpc.StatusCode.NOT_FOUND and "this daemon serves" in out.details else \
            f"{out.code.name}: {out.details}"
    if out.code != grpc.StatusCode.INVALID_ARGUMENT:
        return f"{out.code.name}: {out.details}"
    if case.expect == ANY_FIELD:
        return None if out.details.split(" ")[0].split(":")[0].split("[")[0].split(".")[0] in FIELDS \
            else f"names no field: {out.details!r}"
    assert case.expect is not None      # a bad case names the field its refusal must start with
    if not out.details.startswith(case.expect):
        return f"{out.details!r} does not start with {case.expect!r}"
    return None


def offline_params(sp: pb.SamplingParams):
    from nvllm.server.grpc.generate_request import sampling_params_from_proto
    return sampling_params_from_proto(pb.GenerateRequest(sampling_params=sp))


def offline_prompt(req: pb.GenerateRequest):
    which = req.WhichOneof("input")
    if which == "prompt":
        return req.prompt
    if which == "chat":
        return {"messages": [{"role": m.role, "content": m.content} for m in req.chat.messages]}
    return {"prompt_token_ids": list(req.prompt_token_ids.ids)}


class Tally:
    """Outcomes checked so far, and what went wrong (checked after Hypothesis is done, so that a
    failure is reported with its own request rather than replayed into a flaky one)."""

    def __init__(self) -> None:
        self.counts = {"tried": 0, "served": 0, "refused": 0, "good": 0, "bad": 0, "arbitrary": 0}
        self.defects: dict[str, int] = {}
        self.failures: list[str] = []
        self.compare: list[tuple[pb.GenerateRequest, list[int]]] = []

    def check(self, cases: list[Case], outcomes: list[Outcome]) -> None:
        for case, out in zip(cases, outcomes):
            self.counts["tried"] += 1
            self.counts[case.kind] += 1
            if case.kind == "bad":
                self.defects[case.what] = self.defects.get(case.what, 0) + 1
            if out.code == grpc.StatusCode.OK:
                why = (f"served, expected a refusal naming {case.expect}" if case.kind == "bad"
                       else served_ok(case, out))
                self.counts["served"] += why is None
                if why is None and case.kind == "good":
                    req, rs = case.request, out.responses
                    assert req is not None and rs is not None       # a good case, served (served_ok saw both)
                    sp = req.sampling_params
                    if sp.HasField("seed") or (sp.HasField("temperature") and sp.temperature == 0):
                        self.compare.append((req, [t for r in rs for t in r.token_ids]))
            else:
                why = f"{out.code.name}: {out.details}" if case.kind == "good" else refused_ok(case, out)
                self.counts["refused"] += why is None
            if why is not None:
                self.failures.append(f"{case.kind} ({case.what}): {why}\n{case.request}")


def test_thousands_of_generated_requests_each_served_or_refused_naming_the_field(
        tiny_models: dict[str, Path], tmp_path: Path, reliability) -> None:
    from nvllm import LLM

    d = DaemonProcess(tmp_path, tiny_models[MODEL], CONFIG)
    # The calls run on a loop in a thread of their own, so that Hypothesis draws batch k+1 while
    # the daemon answers batch k.
    loop = asyncio.new_event_loop()
    sender = threading.Thread(target=loop.run_forever, name="fuzz-sender", daemon=True)
    sender.start()
    on_loop = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop)   # noqa: E731
    tally = Tally()
    tag = iter(range(10**9))
    pending: list = []
    channel = None
    t0 = time.monotonic()
    try:
        async def make_channel():
            return grpc.aio.insecure_channel(
                d.address, options=[("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES)])
        channel = on_loop(make_channel()).result()
        call = channel.unary_stream("/nvllm.v1.Generator/Generate", request_serializer=lambda b: b,
                                    response_deserializer=pb.GenerateResponse.FromString)

        def settle() -> None:
            while pending:
                cases, future = pending.pop(0)
                tally.check(cases, future.result(timeout=300))

        @settings(max_examples=NUM_BATCHES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(st.lists(CASES, min_size=BATCH, max_size=BATCH))
        def batch(cases: list[Case]) -> None:
            if tally.failures or d.proc.poll() is not None:
                return
            payloads = [c.payload(str(next(tag))) for c in cases]
            settle()
            pending.append((cases, on_loop(send_all(call, payloads))))

        batch()
        settle()
        assert d.proc.poll() is None, "the daemon died:\n" + d.log()[-4000:]
        assert not tally.failures, f"{len(tally.failures)} wrong answers; the first:\n" + \
            "\n\n".join(tally.failures[:5])
        assert tally.counts["tried"] >= 5000, tally.counts
        seconds = time.monotonic() - t0

        # Served requests were computed right: seeded and greedy ones equal the offline engine's.
        offline = LLM(tiny_models[MODEL], num_blocks=NUM_BLOCKS)
        for k in range(0, len(tally.compare), 64):
            chunk = tally.compare[k:k + 64]
            want = offline.generate([offline_prompt(r) for r, _ in chunk],
                                    [offline_params(r.sampling_params) for r, _ in chunk])
            for (req, got), w in zip(chunk, want):
                assert got == w.token_ids, f"daemon {got} != offline {w.token_ids} for\n{req}"

        errors = [line for line in d.lines if line.startswith(("ERROR", "CRITICAL")) or "Traceback" in line]
        assert not errors, "\n".join(errors[:20])
        warnings = [line for line in d.lines if "Warning" in line]
        assert not warnings, "\n".join(warnings[:20])
        h = assert_sound(d, offline)
        c = tally.counts
        reliability("bad_input", tried=c["tried"], served=c["served"], refused_invalid_argument=c["refused"],
                    other_outcomes=c["tried"] - c["served"] - c["refused"], good=c["good"], bad=c["bad"],
                    arbitrary=c["arbitrary"], kinds_of_defect=len(tally.defects),
                    compared_with_offline=len(tally.compare), crashes=0, error_log_lines=len(errors),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached, seconds=round(seconds, 1))
    finally:
        if channel is not None:
            on_loop(channel.close()).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        sender.join(10)
        loop.close()
        d.stop()
