"""nvllm on 64-bit ARM: the daemon round trip that runs under emulation, and the test that runs it there.

deploy/aarch64-check.sh builds a Debian arm64 root, runs it through qemu's user-mode emulation,
installs nvllm there with pip and runs `pytest -m aarch64`: the golden tests on the tiny models
(test_golden.py, test_tokenizer_golden.py), the C kernels' tests (test_kernels_match_numpy.py,
test_kernel_*.py, test_matmul_kernels.py, test_f32_kernel.py: NEON and the portable variants;
test_qdot.py: the integer dot products, x in int8 with NEON's sdot, plain NEON and portable C, and in
int16 with NEON and portable C) and the round trip below. The round trip also runs natively with the
rest of the suite.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import grpc
import pytest

from helpers import emulation
from helpers.daemon_util import DaemonProcess
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

EMULATION_TIMEOUT_S = 45 * 60
EXIT_SKIP = 77


@pytest.mark.aarch64
def test_daemon_round_trip_serve_health_and_a_streamed_answer(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    model = tiny_models["tiny-llama"]
    daemon = DaemonProcess(tmp_path, model, config=None, num_blocks=64, plain=True)
    try:
        h = daemon.cli("health", "--json")
        assert h.returncode == 0, h.stderr
        health = json.loads(h.stdout)
        assert health["state"] == "SERVING" and health["model"] == "tiny-llama"
        assert health["pages_total"] == 64 and health["startup_s"] > 0

        req = pb.GenerateRequest(prompt="The quick brown fox",
                                 sampling_params=pb.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        with grpc.insecure_channel(daemon.address) as channel:
            deltas = list(pb_grpc.GeneratorStub(channel).Generate(req, timeout=300))
        assert len(deltas) > 1, "the answer should come as a stream of deltas"
        last = deltas[-1]
        assert last.finish_reason == pb.FINISH_REASON_LENGTH and last.usage.completion_tokens == 12
        token_ids = [t for d in deltas for t in d.token_ids]

        from nvllm import LLM, SamplingParams
        want = LLM(model, num_blocks=64).generate(["The quick brown fox"],
                                                  SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
        assert (token_ids, "".join(d.text for d in deltas)) == (want.token_ids, want.text)
    finally:
        rc = daemon.stop()
    assert rc == 0, daemon.log()


@pytest.mark.slow
def test_emulated_aarch64_run_passes() -> None:
    """deploy/aarch64-check.sh end to end: arm64 root, pip install there, `pytest -m aarch64` under qemu. The run
    started when the session collected this test (tests/conftest.py, helpers/emulation.py), which runs last."""
    if os.environ.get("NVLLM_SKIP_AARCH64") == "1":
        pytest.skip("NVLLM_SKIP_AARCH64=1")
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    rc, out, took = emulation.result(EMULATION_TIMEOUT_S)
    if rc == EXIT_SKIP:
        reason = next((ln.split("SKIP: ", 1)[1] for ln in out.splitlines() if "SKIP: " in ln), out.strip()[-300:])
        pytest.skip(f"aarch64 emulation cannot run here: {reason}")
    assert rc == 0, f"aarch64-check.sh failed (exit {rc}) after {took:.0f} s:\n{out[-8000:]}"
    assert " passed" in out and "aarch64" in out, out[-4000:]
    print(f"\naarch64 emulated run: {took:.0f} s since it started\n" + "\n".join(
        ln for ln in out.splitlines() if ln.startswith("aarch64-check:") or " passed" in ln))
