"""Several models in one daemon (the real process, over HTTP and gRPC): tiny-llama (the default) and
SmolLM2's GGUF, each answered by name, listed with whether it is loaded; an unknown name refused naming
the choices; keep_alive 0 gives SmolLM2's memory back within seconds of its last request (the resident set
drops); a budget that does not hold both unloads the idle one to load the other, and refuses cleanly
when the other is pinned, while a stream on it goes on; models loaded and unloaded while requests stream
lose nothing and leak no page."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import grpc
import httpx2 as httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, health, health_when, joined, pages_all_back, wait_for
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

SMOL_NAME = "smollm2-135m-instruct"
MiB = 1 << 20


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4,
            "temperature": 0, **extra}


def model_health(address: str) -> dict[str, pb.ModelHealth]:
    return {m.name: m for m in health(address).models}


@pytest.fixture(scope="module")
def daemon(tiny: Path, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("several"), tiny, BASE_CONFIG, http_listen="127.0.0.1:0",
                      extra_args=("--model", str(smollm2_gguf)))
    yield d
    d.stop()


def test_each_model_answers_by_name_and_is_listed(daemon: DaemonProcess) -> None:
    h = model_health(daemon.address)
    assert list(h) == ["tiny-llama", SMOL_NAME] and h["tiny-llama"].default and h["tiny-llama"].state == \
        pb.ModelHealth.STATE_LOADED and h[SMOL_NAME].state == pb.ModelHealth.STATE_UNLOADED
    with httpx.Client(base_url=daemon.http_url, timeout=120) as c:
        listed = {m["id"]: m["loaded"] for m in c.get("/v1/models").json()["data"]}
        assert listed == {"tiny-llama": True, SMOL_NAME: False}
        smol = c.post("/v1/chat/completions", json=chat(SMOL_NAME)).json()
        tiny = c.post("/v1/chat/completions", json=chat("")).json()        # no name: the default
        unknown = c.post("/v1/chat/completions", json=chat("gpt-9"))
        listed = {m["id"]: m["loaded"] for m in c.get("/v1/models").json()["data"]}
    assert smol["model"] == SMOL_NAME and tiny["model"] == "tiny-llama" and listed[SMOL_NAME] is True
    assert smol["choices"][0]["message"]["content"] != tiny["choices"][0]["message"]["content"]
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert "this daemon serves 'tiny-llama', 'smollm2-135m-instruct'" in unknown.json()["error"]["message"]
    with grpc.insecure_channel(daemon.address) as ch:
        stub = pb_grpc.GeneratorStub(ch)
        req = pb.GenerateRequest(model=SMOL_NAME, sampling_params=pb.SamplingParams(temperature=0, max_tokens=4))
        req.chat.messages.add(role="user", content="Say hello")
        assert joined(list(stub.Generate(req, timeout=60)))[0] == smol["choices"][0]["message"]["content"]
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(pb.GenerateRequest(model="gpt-9", prompt="hi"), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    h = model_health(daemon.address)
    assert h[SMOL_NAME].state == pb.ModelHealth.STATE_LOADED and h[SMOL_NAME].requests == 2
    assert h[SMOL_NAME].bytes > 90 * MiB and h[SMOL_NAME].pages_total == 256
    shown = daemon.cli("health").stdout
    assert "* tiny-llama: loaded" in shown and f"  {SMOL_NAME}: loaded, {h[SMOL_NAME].bytes // MiB} MiB" in shown
    with httpx.Client(base_url=daemon.http_url, timeout=30) as c:
        families = list(text_string_to_metric_families(c.get("/metrics").text))
    samples = {(s.name, s.labels.get("model_name")): s.value for f in families for s in f.samples}
    finished = {m: sum(s.value for f in families for s in f.samples
                       if s.name == "vllm:request_success_total" and s.labels["model_name"] == m)
                for m in ("tiny-llama", SMOL_NAME)}
    for name in ("tiny-llama", SMOL_NAME):     # vLLM's model_name label, a series per model
        assert samples[("nvllm:model_loaded", name)] == 1.0 and samples[("vllm:num_requests_running", name)] == 0
        assert samples[("nvllm:model_memory_bytes", name)] == h[name].bytes
    assert finished[SMOL_NAME] == 2 and finished["tiny-llama"] == 1     # each request counted against its model
    with httpx.Client(base_url=daemon.http_url, timeout=30) as c:
        listed = {m["name"]: m for m in c.get("/health").json()["models"]}
    assert listed[SMOL_NAME]["state"] == "loaded" and listed[SMOL_NAME]["requests"] == 2
    assert listed["tiny-llama"]["default"] and listed[SMOL_NAME]["bytes"] == h[SMOL_NAME].bytes
    assert samples[("nvllm:memory_budget_bytes", "tiny-llama")] == health(daemon.address).memory_budget_bytes


def test_keep_alive_zero_gives_the_memory_back(daemon: DaemonProcess) -> None:
    proc = psutil.Process(daemon.proc.pid)
    with httpx.Client(base_url=daemon.http_url, timeout=120) as c:
        assert c.post("/v1/chat/completions", json=chat(SMOL_NAME)).status_code == 200
        held = model_health(daemon.address)[SMOL_NAME].bytes
        loaded_rss = proc.memory_info().rss
        assert c.post("/v1/chat/completions", json=chat(SMOL_NAME, keep_alive=0)).status_code == 200
    t0 = time.monotonic()
    wait_for(lambda: model_health(daemon.address)[SMOL_NAME].state == pb.ModelHealth.STATE_UNLOADED,
             "SmolLM2 unloaded", 10)
    unloaded_after = time.monotonic() - t0
    wait_for(lambda: loaded_rss - proc.memory_info().rss > 0.6 * held, "the resident set down by its weights", 10)
    print(f"\nSmolLM2 held {held / MiB:.0f} MiB; unloaded {unloaded_after:.1f} s after its request; resident set "
          f"{loaded_rss / MiB:.0f} -> {proc.memory_info().rss / MiB:.0f} MiB")
    assert model_health(daemon.address)[SMOL_NAME].keep_alive_s == 0.0
    with httpx.Client(base_url=daemon.http_url, timeout=120) as c:      # loaded again on its next request
        again = c.post("/v1/chat/completions", json=chat(SMOL_NAME, keep_alive="5m"))
    assert again.status_code == 200 and model_health(daemon.address)[SMOL_NAME].loads >= 2


def budget_gb(daemon: DaemonProcess) -> float:
    """A budget that holds either model alone but not both (their bytes as the first daemon loaded them)."""
    h = model_health(daemon.address)
    if h[SMOL_NAME].bytes == 0:
        with httpx.Client(base_url=daemon.http_url, timeout=120) as c:
            c.post("/v1/chat/completions", json=chat(SMOL_NAME))
        h = model_health(daemon.address)
    return (h[SMOL_NAME].bytes + h["tiny-llama"].bytes // 2) / (1 << 30)


def test_a_small_budget_unloads_the_idle_model_and_refuses_past_a_pinned_one(
        daemon: DaemonProcess, tiny: Path, smollm2_gguf: Path, tmp_path: Path) -> None:
    gb = budget_gb(daemon)
    d = DaemonProcess(tmp_path / "swap", tiny, BASE_CONFIG, http_listen="127.0.0.1:0",
                      extra_args=("--model", str(smollm2_gguf), "--memory-gb", f"{gb:.6f}"))
    try:
        with httpx.Client(base_url=d.http_url, timeout=120) as c:
            assert c.post("/v1/chat/completions", json=chat(SMOL_NAME)).status_code == 200
            h = model_health(d.address)
            assert h["tiny-llama"].state == pb.ModelHealth.STATE_UNLOADED and h[SMOL_NAME].state == \
                pb.ModelHealth.STATE_LOADED
            assert c.post("/v1/chat/completions", json=chat("tiny-llama")).status_code == 200
            h = model_health(d.address)
            assert h["tiny-llama"].state == pb.ModelHealth.STATE_LOADED and h[SMOL_NAME].state == \
                pb.ModelHealth.STATE_UNLOADED
        assert health(d.address).memory_held_bytes <= health(d.address).memory_budget_bytes
    finally:
        d.stop()

    # --model tiny (the launcher's) pinned by [model], beside the file's [[models]] SmolLM2
    pinned = BASE_CONFIG + f'\n[model]\npinned = true\n[[models]]\npath = "{smollm2_gguf}"\n'
    d = DaemonProcess(tmp_path / "pinned", tiny, pinned, http_listen="127.0.0.1:0",
                      extra_args=("--memory-gb", f"{gb:.6f}"))
    try:
        async def go() -> tuple[httpx.Response, list[pb.GenerateResponse], grpc.aio.AioRpcError]:
            async with httpx.AsyncClient(base_url=d.http_url, timeout=120) as c, \
                    grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                long = pb.GenerateRequest(prompt="keep going", sampling_params=pb.SamplingParams(
                    temperature=0, max_tokens=120, ignore_eos=True))
                stream = asyncio.ensure_future(_collect(stub.Generate(long, timeout=120)))
                await asyncio.sleep(0.2)
                refused = await c.post("/v1/chat/completions", json=chat(SMOL_NAME))
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _collect(stub.Generate(pb.GenerateRequest(model=SMOL_NAME, prompt="hi"), timeout=60))
                return refused, await stream, e.value

        refused, streamed, rpc = asyncio.run(go())
        err = refused.json()["error"]
        assert refused.status_code == 503 and err["code"] == "insufficient_memory"
        assert "memory budget" in err["message"] and "held: tiny-llama" in err["message"]
        assert rpc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "memory budget" in rpc.details()
        assert streamed[-1].finish_reason == pb.FINISH_REASON_LENGTH and streamed[-1].usage.completion_tokens == 120
        assert model_health(d.address)[SMOL_NAME].state == pb.ModelHealth.STATE_UNLOADED
        health_when(d.address, pages_all_back, "every page back", timeout=30)
    finally:
        d.stop()


async def _collect(call: object) -> list[pb.GenerateResponse]:
    return [r async for r in call]  # type: ignore[attr-defined]


def test_models_loaded_and_unloaded_while_requests_stream(daemon: DaemonProcess) -> None:
    """keep_alive 0 on SmolLM2 while tiny-llama streams: every request finishes, no page is left behind."""
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=daemon.http_url, timeout=120) as c:
            streams = [c.post("/v1/completions", json={"prompt": f"count {i}", "max_tokens": 60, "temperature": 0,
                                                       "ignore_eos": True}) for i in range(6)]
            swaps: list[Awaitable[object]] = []
            for _ in range(3):
                swaps.append(c.post("/v1/chat/completions", json=chat(SMOL_NAME, keep_alive=0)))
                swaps.append(asyncio.sleep(1.2))
            done = await asyncio.gather(*streams, *swaps)
            return [r for r in done if isinstance(r, httpx.Response)]

    answers = asyncio.run(go())
    assert [r.status_code for r in answers] == [200] * len(answers)
    assert all(r.json()["usage"]["completion_tokens"] == 60 for r in answers[:6])
    assert model_health(daemon.address)[SMOL_NAME].loads >= 2
    health_when(daemon.address, pages_all_back, "every page of the default model back", timeout=30)
    wait_for(lambda: model_health(daemon.address)[SMOL_NAME].state == pb.ModelHealth.STATE_UNLOADED,
             "SmolLM2 unloaded again", 10)
