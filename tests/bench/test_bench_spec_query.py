"""nvllm bench --speculation-query: speculation timed through a running daemon's HTTP API, each task with
its proposals and without on the same daemon, streamed and whole, the two greedy answers the same text.

The daemon serves tiny-qwen2 (a 512-token context, so that the tasks fit) with n-gram speculation, every
proposal verified (adaptive off), so that the proposal counters move whatever this machine's step costs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with
from helpers.paths import ROOT

SPECULATING = config_with(BASE_CONFIG, speculative__method="ngram", speculative__num_tokens=3,
                          speculative__adaptive=False)


@pytest.fixture(scope="module")
def daemon(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp("daemon"), tiny_models["tiny-qwen2"], config=SPECULATING,
                      http_listen="127.0.0.1:0")
    yield d
    assert d.stop() == 0, d.log()


def bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_each_task_is_timed_with_and_without_its_proposals_streamed_and_whole(daemon: DaemonProcess) -> None:
    from nvllm.bench.speculation import TASKS
    from nvllm.bench.speculation_query import format_speculation_query

    res = bench("--speculation-query", daemon.http_url, "--gen-len", "24", "--repeats", "1", "--json")
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert [t["task"] for t in obj["tasks"]] == list(TASKS) and obj["url"] == daemon.http_url
    ran = [t for t in obj["tasks"] if "skipped" not in t]
    assert ran
    for t in ran:
        assert t["same_text"] and t["tokens"] > 1   # greedy either way: the same answer
        for kind in ("stream", "whole"):
            assert t[f"{kind}_ms_without"] > 0 and t[f"{kind}_ms_with"] > 0
            assert t[f"{kind}_speedup"] > 0
        assert 0 <= t["acceptance_rate"] <= 1 and t["first_token_ms_with"] > 0
    assert sum(t["proposed_per_answer"] for t in ran) > 0   # the daemon's counters moved
    text = format_speculation_query(obj)
    assert "speed-up" in text and all(t["task"] in text for t in obj["tasks"])


def test_a_daemon_that_cannot_be_reached_is_named_and_fails_the_bench() -> None:
    res = bench("--speculation-query", "http://127.0.0.1:9", "--gen-len", "4")
    assert res.returncode == 1 and "http://127.0.0.1:9" in res.stderr
