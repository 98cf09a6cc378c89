"""End-to-end: the real daemon reading a made /sys ([power] sysfs_root) every 0.2 s. A CPU zone written hot
shows as throttled in gRPC Health, HTTP /health and /metrics within seconds, with one warning in the log, and
the engine thread halves its step budget; the daemon still answers meanwhile; written cool again, all of it
clears with one info line."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import (
    BASE_CONFIG,
    DaemonProcess,
    health,
    health_when,
    joined,
    request,
    wait_for,
)
from helpers.sysfs_tree import board, set_temp
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

WITHIN_S = 10.0


def power_config(sysfs: Path, more: str = "") -> str:
    # Written out: config_with matches keys across sections, and [watchdog] has an interval_s too.
    return BASE_CONFIG + f'[power]\nsysfs_root = "{sysfs}"\ninterval_s = 0.2\n{more}'


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:    # /health answers 503 while not serving; the body says why
        return e.code, e.read()


def heat_series(d: DaemonProcess) -> dict[str, float]:
    text = get(d.http_url + "/metrics")[1].decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name in ("nvllm:thermal_throttled", "nvllm:cpu_temperature_celsius")}


def test_a_hot_board_shows_throttled_everywhere_and_clears(tiny: Path, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    zones = board(sysfs, {"gpu-thermal": 70_000, "cpu-thermal": 50_000, "tj-thermal": 51_000})
    config = power_config(sysfs)
    d = DaemonProcess(tmp_path / "daemon", tiny, config, http_listen="127.0.0.1:0")
    try:
        h = health_when(d.address, lambda h: h.HasField("cpu_temperature_celsius"), "a first reading", WITHIN_S)
        assert (h.thermal_throttled, h.cpu_temperature_celsius, h.throttle_reason) == (False, 51.0, "")
        assert heat_series(d) == {"nvllm:thermal_throttled": 0.0, "nvllm:cpu_temperature_celsius": 51.0}

        mark = len(d.lines)
        set_temp(zones["cpu-thermal"], 90_000)
        h = health_when(d.address, lambda h: h.thermal_throttled, "throttled in Health", WITHIN_S)
        assert h.cpu_temperature_celsius == 90.0
        assert h.throttle_reason == "CPU at 90.0 C, at or above power.throttle_c 85 C"
        assert h.state == pb.HealthResponse.STATE_SERVING          # throttled, still admitting
        assert wait_for(lambda: heat_series(d).get("nvllm:thermal_throttled") == 1.0, "throttled in /metrics",
                        WITHIN_S)
        assert heat_series(d)["nvllm:cpu_temperature_celsius"] == 90.0
        status, body = get(d.http_url + "/health")
        page = json.loads(body)
        assert (status, page["thermal_throttled"], page["cpu_temperature_celsius"]) == (200, True, 90.0)
        assert page["throttle_reason"] == h.throttle_reason
        line = d.wait_line("thermal throttle on", mark)
        assert line.startswith("WARNING") and "CPU at 90.0 C" in line
        d.wait_line("a step's token budget 128 of 256", mark)    # the engine thread took it: half of 256
        shown = d.cli("health")
        assert shown.returncode == 0, shown.stderr
        assert "  heat: CPU at 90.0 C, THROTTLED: CPU at 90.0 C, at or above power.throttle_c 85 C\n" in shown.stdout

        req = request("The quick brown fox", max_tokens=8, temperature=0, ignore_eos=True)
        req.priority = -1
        with grpc.insecure_channel(d.address) as ch:
            _, tokens = joined(list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=60)))
        assert len(tokens) == 8

        set_temp(zones["cpu-thermal"], 80_000)          # below throttle_c, not below resume_c: still throttled
        wait_for(lambda: health(d.address).cpu_temperature_celsius == 80.0, "the 80 C reading", WITHIN_S)
        assert health(d.address).thermal_throttled
        set_temp(zones["cpu-thermal"], 60_000)
        h = health_when(d.address, lambda h: not h.thermal_throttled, "cleared in Health", WITHIN_S)
        assert (h.cpu_temperature_celsius, h.throttle_reason) == (60.0, "")
        assert wait_for(lambda: heat_series(d).get("nvllm:thermal_throttled") == 0.0, "cleared in /metrics",
                        WITHIN_S)
        assert d.wait_line("thermal throttle off", mark).startswith("INFO")
        d.wait_line("a step's token budget 256 of 256", mark)
        assert sum("thermal throttle" in line for line in d.lines[mark:]) == 2      # once per change
    finally:
        assert d.stop() == 0


def test_power_off_reads_nothing_and_reports_nothing(tiny: Path, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    board(sysfs, {"cpu-thermal": 95_000})
    config = power_config(sysfs, "enabled = false\n")
    d = DaemonProcess(tmp_path / "daemon", tiny, config, http_listen="127.0.0.1:0")
    try:
        h = health(d.address)
        assert (h.thermal_throttled, h.HasField("cpu_temperature_celsius")) == (False, False)
        assert heat_series(d) == {}
        assert json.loads(get(d.http_url + "/health")[1])["cpu_temperature_celsius"] is None
        assert not any("heat" in line for line in d.lines)
    finally:
        assert d.stop() == 0
