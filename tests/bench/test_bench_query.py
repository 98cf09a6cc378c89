"""nvllm bench --query: the drone's question through a real daemon's HTTP and gRPC front doors, streamed, each
door's time split from the daemon's /metrics (queue, prefill, what came before the engine, each decode step as
the engine ran it, the front door's and the client's gap, the delivery between them), and with --model the
same question's decode in the bench's process beside it; bad URLs refused by the flag's name."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.daemon_util import DaemonProcess
from helpers.paths import ROOT
from nvllm.bench.query import ANSWER_TOKENS, SYSTEM_TOKENS, QueryError, drone_query, format_query, server_split

KEY = "sk-nvllm-query-key"
CONFIG = """
[http]
api_key_file = "{key}"
[cache]
block_size = 16
[scheduler]
max_num_seqs = 4
max_num_batched_tokens = 512
max_model_len = 512
"""


@pytest.fixture(scope="module")
def qwen2(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-qwen2"]   # a context of 512 tokens: room for the question


@pytest.fixture(scope="module")
def daemon(qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("query")
    (tmp / "key").write_text(KEY + "\n")
    d = DaemonProcess(tmp, qwen2, config=CONFIG.format(key=tmp / "key"), http_listen="127.0.0.1:0")
    yield d
    assert d.stop() == 0, d.log()


def test_each_front_door_is_timed_and_split(daemon: DaemonProcess) -> None:
    r = drone_query([daemon.http_url, "grpc://" + daemon.address], repeats=2, api_key=KEY)
    assert [d["front_door"] for d in r["front_doors"]] == ["http", "grpc"]
    for d in r["front_doors"]:
        assert d["cached_tokens"] >= SYSTEM_TOKENS   # the system prompt's pages came from the prefix cache
        assert 0 < d["first_token_ms_p50"] <= d["seconds_max"] * 1e3 and d["seconds_min"] <= d["seconds_max"]
        assert d["client_gap_ms"] > 0 and d["decode_tokens_per_s"] > 0
        s = d["split"]
        assert {"ttft_ms", "queue_ms", "prefill_ms", "before_engine_ms", "decode_step_ms",
                "front_door_gap_ms"} <= set(s)
        assert 0 < s["decode_step_ms"] and s["prefill_ms"] < s["ttft_ms"]
        assert d["delivery_ms"] == pytest.approx(d["client_gap_ms"] - s["decode_step_ms"], abs=0.02)
    text = format_query(r)
    assert text.count("drone query over") == 2 and "delivery" in text and "the engine's decode step" in text


def test_the_cli_compares_with_the_bench_on_the_same_model(daemon: DaemonProcess, qwen2: Path,
                                                           tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY)
    base = [sys.executable, "-m", "nvllm.cli", "bench", "--query", daemon.http_url, "--repeats", "1"]
    out = subprocess.run([*base, "--api-key-file", str(tmp_path / "key"), "--model", str(qwen2), "--threads", "1",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["bench_gap_ms"] > 0 and r["answer_tokens"] == ANSWER_TOKENS
    assert "of the bench's tokens/s" in format_query(r)
    refused = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=300)   # no key
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1:1", "http://127.0.0.1", "grpc://:5"])
def test_a_url_without_a_front_doors_scheme_host_and_port_is_refused(url: str) -> None:
    with pytest.raises(QueryError, match="--query"):
        drone_query(url)


def test_a_daemon_that_is_not_there_is_named() -> None:
    with pytest.raises(QueryError, match="http://127.0.0.1:9"):
        drone_query("http://127.0.0.1:9")


def test_the_decode_step_is_the_steps_after_each_prefill() -> None:
    before = {part: (0.0, 0.0) for part in ("ttft", "queue", "prefill", "first_decode", "itl", "step")}
    after = {"ttft": (0.5, 2.0), "queue": (0.02, 2.0), "prefill": (0.4, 2.0), "first_decode": (0.04, 2.0),
             "itl": (0.8, 38.0), "step": (1.16, 40.0)}   # 2 prefill steps (0.4 s) and 38 decode steps (0.76 s)
    s = server_split(before, after)
    assert s["decode_step_ms"] == pytest.approx(20.0) and s["before_engine_ms"] == pytest.approx(40.0)
    assert s["front_door_gap_ms"] == pytest.approx(0.8 / 38 * 1e3, abs=0.01)
