"""Updates in place on the real daemon: `nvllm models reload NAME` (gRPC ReloadModel) and SIGHUP put the
model's new file in service (its greedy answers now the new weights'), a file cut short leaves the old one
serving with the reason in the command's output, in Health (gRPC and HTTP) and in /metrics; an unknown name
is refused naming the choices; requests streaming while the model is swapped three times all finish."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, health, health_when, joined, pages_all_back, request
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

NAME = "tiny-work"


def put(src: Path, dest: Path) -> None:
    part = dest.with_name("." + dest.name + ".part")
    shutil.copyfile(src, part)
    os.replace(part, dest)


def greedy(address: str) -> str:
    with grpc.insecure_channel(address) as ch:
        got = list(pb_grpc.GeneratorStub(ch).Generate(request("The quick brown fox", temperature=0, max_tokens=8,
                                                              ignore_eos=True), timeout=60))
    return joined(got)[0]


@pytest.fixture(scope="module")
def setup(tiny_ggufs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess,
                                                                                                    Path, Path, Path]]:
    tmp = tmp_path_factory.mktemp("reload")
    a, b = tiny_ggufs["tiny-llama"], tiny_ggufs["tiny-llama-f16"]
    work = tmp / "models" / f"{NAME}.gguf"
    work.parent.mkdir()
    put(a, work)
    d = DaemonProcess(tmp, work, BASE_CONFIG, http_listen="127.0.0.1:0")
    yield d, work, a, b
    d.stop()


def test_reload_and_sighup_put_the_new_file_in_service(setup: tuple[DaemonProcess, Path, Path, Path]) -> None:
    d, work, a, b = setup
    first = greedy(d.address)
    put(b, work)
    done = d.cli("models", "reload", NAME)
    assert done.returncode == 0 and done.stdout.startswith(f"{NAME}: swapped:"), done.stdout + done.stderr
    second = greedy(d.address)
    assert second != first
    put(a, work)
    start = len(d.lines)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_line(f"model {NAME}: update swapped", start)
    assert greedy(d.address) == first
    start = len(d.lines)
    d.proc.send_signal(signal.SIGHUP)          # nothing changed since
    d.wait_line("SIGHUP: no loaded model's files changed", start)
    m = next(m for m in health(d.address).models if m.name == NAME)
    assert m.update_state == "swapped" and m.loads == 3 and not m.update_error

    unknown = d.cli("models", "reload", "gpt-9")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and NAME in unknown.stderr


def test_a_file_cut_short_leaves_the_old_serving_and_says_why(setup: tuple[DaemonProcess, Path, Path, Path]) -> None:
    d, work, a, b = setup
    put(a, work)
    d.cli("models", "reload", NAME)
    before = greedy(d.address)
    part = work.with_name(".cut.part")
    part.write_bytes(b.read_bytes()[: b.stat().st_size // 3])
    os.replace(part, work)
    done = d.cli("models", "reload", NAME)
    assert done.returncode == 1 and f"{NAME}: failed:" in done.stdout and "serves on" in done.stdout, done.stdout
    assert greedy(d.address) == before
    m = next(m for m in health(d.address).models if m.name == NAME)
    assert m.update_state == "failed" and "serves on" in m.update_error and m.state == pb.ModelHealth.STATE_LOADED
    assert f"model {NAME}: update failed" in d.log()
    with httpx.Client(base_url=d.http_url, timeout=30) as c:
        row = next(m for m in c.get("/health").json()["models"] if m["name"] == NAME)
        metrics = c.get("/metrics").text
    assert row["update_state"] == "failed" and row["update_error"] == m.update_error
    assert f'nvllm:model_updates_total{{model_name="{NAME}",outcome="failed"}} 1.0' in metrics
    assert "last update: failed" in d.cli("health").stdout


def test_requests_stream_while_the_model_is_swapped_three_times(setup: tuple[DaemonProcess, Path, Path, Path]
                                                               ) -> None:
    """Six gRPC clients stream greedy requests while ReloadModel swaps the model three times (b, a, b): every
    request finishes whole on one version, nothing is refused, the last answers are b's, every page is back."""
    d, work, a, b = setup
    put(a, work)
    d.cli("models", "reload", NAME)
    params = dict(temperature=0, max_tokens=24, ignore_eos=True)

    async def main() -> tuple[list[str], list[str]]:
        async with grpc.aio.insecure_channel(d.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)

            async def one() -> str:
                got = [r async for r in stub.Generate(request("The quick brown fox", **params), timeout=60)]
                assert got[-1].finish_reason == pb.FINISH_REASON_LENGTH
                return joined(got)[0]
            want_a = await one()
            answers: list[str] = []
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    answers.append(await one())
            clients = [asyncio.create_task(client()) for _ in range(6)]
            outcomes = []
            for src in (b, a, b):
                put(src, work)
                before = len(answers)
                r = await stub.ReloadModel(pb.ReloadModelRequest(model=NAME), timeout=120)
                outcomes.append(r.outcome)
                while len(answers) < before + 12:
                    await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*clients)
            last = [await one() for _ in range(2)]
            return [want_a, *outcomes], answers + last

    (want_a, *outcomes), answers = asyncio.run(asyncio.wait_for(main(), 300))
    assert outcomes == ["swapped"] * 3
    kinds = set(answers)
    assert want_a in kinds and len(kinds) == 2, kinds        # a's and b's answers, none mixed
    assert answers[-1] != want_a
    h = health_when(d.address, lambda h: pages_all_back(h) and all(not m.retiring for m in h.models),
                    "every page back and the old versions unloaded", 30)
    assert h.models[0].update_state == "swapped"
    assert "refused" not in "\n".join(line for line in d.lines if "ReloadModel" not in line)
