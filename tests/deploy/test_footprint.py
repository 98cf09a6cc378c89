"""The daemon on an edge board: idle at rest, quick to start, and its memory is what it says.

- At rest the daemon uses under 1% of a core: the engine thread sleeps until work arrives.
- Start-up (launch to READY) is logged and `nvllm health --json` reports it (startup_s).
- The resident set after start-up is weights + page pool + at most RUNTIME_OVERHEAD_BYTES, and it
  does not grow when requests run.
- The page pool is zeroed and resident when KVCache returns (mmap with MAP_POPULATE, else a write per
  page), on every allocation path, and it is unmapped when the last view of it goes. (The daemon backs
  one sequence's pages before READY and the rest just after: the resident set is measured once Health
  says the whole pool is backed.)
- Weights are copied once from the memory-mapped files: loading peaks at about the weights' size.
- `nvllm serve --dry-run [--memory-gb N]` prints the sizing it would do, the demand cap included.

SmolLM2-135M is used where it is pulled (CI pulls it), the tiny Llama elsewhere.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psutil
import pytest

from helpers.daemon_util import ROOT, DaemonProcess
from nvllm.engine.assembly.memory import RUNTIME_OVERHEAD_BYTES, GiB, MiB, size_pool
from nvllm.model import kv_cache
from nvllm.model.config import load_config
from nvllm.model.kv_cache import KVCache
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

NUM_BLOCKS = 256
IDLE_WINDOW_S = 10.0
IDLE_LIMIT = 0.01          # of one core
SETTLE_S = 2.0             # after READY, before measuring: let start-up's last work finish


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    smollm2 = ROOT / "models" / "smollm2-135m-instruct"
    return smollm2 if (smollm2 / "config.json").exists() else tiny_models["tiny-llama"]


@pytest.fixture(scope="module")
def daemon(model: Path, tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp("footprint"), model, config=None, num_blocks=NUM_BLOCKS, plain=True)
    yield d
    assert d.stop() == 0, d.log()


def pool_bytes(model: Path, num_blocks: int = NUM_BLOCKS, block_size: int = 16) -> int:
    c = load_config(model)
    return num_blocks * KVCache.bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim)


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


# Order matters within the module: idle is measured first, before any request has run.
def test_idle_daemon_uses_under_one_percent_of_a_core(daemon: DaemonProcess) -> None:
    p = psutil.Process(daemon.pid)
    time.sleep(SETTLE_S)
    c0, t0 = cpu_seconds(p), time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    c1, t1 = cpu_seconds(p), time.monotonic()
    share = (c1 - c0) / (t1 - t0)
    print(f"\nidle CPU over {t1 - t0:.1f} s: {share * 100:.2f}% of a core ({c1 - c0:.3f} s CPU, "
          f"{p.num_threads()} threads)")
    assert share < IDLE_LIMIT, f"idle daemon used {share * 100:.2f}% of a core over {t1 - t0:.1f} s"


def test_startup_is_logged_and_reported_by_health_json(daemon: DaemonProcess) -> None:
    logged = [float(m.group(1)) for line in daemon.lines
              if (m := re.search(r"ready in ([\d.]+) s since process start", line))]
    assert logged, daemon.log()
    h = daemon.cli("health", "--json")
    assert h.returncode == 0, h.stderr
    reported = json.loads(h.stdout)["startup_s"]
    print(f"\nstart-up: {reported:.2f} s from process start to READY (logged {logged[0]:.2f} s; "
          f"{daemon.ready_after_s:.2f} s from launch to the serving line, seen by the test)")
    assert reported == pytest.approx(logged[0], abs=0.01)
    # Measured from the process's own start (to the kernel's tick), which comes after the launch.
    assert 0 < reported <= daemon.ready_after_s + 0.05


def test_startup_log_lists_what_is_held_besides_weights_pool_and_scratch(daemon: DaemonProcess) -> None:
    """engine/assembly/footprint.py's lines, one log line per model loaded: each part with its MiB, adding up."""
    held = [line for line in daemon.lines if "held besides the weights, pool and scratch: " in line]
    assert len(held) == 1, daemon.log()
    parts = dict(part.split(": ", 1) for part in held[0].split("held besides the weights, pool and scratch: ")[1]
                 .split("; ") if ": " in part)
    assert {"interpreter and imports", "tokenizer and vocabulary", "grammar compiler", "other",
            "total besides the weights"} <= set(parts), held[0]
    mib = {k: int(m.group(1)) for k, v in parts.items() if (m := re.match(r"(-?\d+) MiB", v))}
    assert parts["grammar compiler"].startswith("0 MiB")   # no request asked for structure
    assert abs(mib["interpreter and imports"] + mib["tokenizer and vocabulary"] + mib["other"]
               - mib["total besides the weights"]) <= 3
    assert 0 < mib["total besides the weights"] * MiB <= RUNTIME_OVERHEAD_BYTES
    print(f"\nheld besides the weights, pool and scratch at load: {held[0].split(': ', 1)[1]}")


def test_resident_set_is_weights_plus_pool_plus_a_stated_overhead(daemon: DaemonProcess, model: Path) -> None:
    weights = load_config(model).weight_bytes
    pool = pool_bytes(model)
    p = psutil.Process(daemon.pid)
    with grpc.insecure_channel(daemon.address) as channel:
        health = pb_grpc.GeneratorStub(channel).Health
        deadline = time.monotonic() + 60
        while (h := health(pb.HealthRequest(), timeout=10)).pages_backed < h.pages_total:
            assert time.monotonic() < deadline, "the pool was not backed within 60 s"
            time.sleep(0.1)
    rss = p.memory_info().rss
    over = rss - weights - pool
    print(f"\nRSS after READY: {rss / MiB:.1f} MiB = weights {weights / MiB:.1f} + pool {pool / MiB:.1f} "
          f"+ {over / MiB:.1f} MiB runtime (bound {RUNTIME_OVERHEAD_BYTES / MiB:.0f} MiB)")
    assert weights + pool <= rss, "the weights and the touched pool should be resident"
    assert over <= RUNTIME_OVERHEAD_BYTES

    # Requests do not grow it: the pool is touched at start-up, the rest is step-sized.
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.GeneratorStub(channel)
        for i in range(4):
            req = pb.GenerateRequest(prompt=f"Request {i}: the quick brown fox jumps over the lazy dog " * 4,
                                     sampling_params=pb.SamplingParams(temperature=0, max_tokens=16))
            list(stub.Generate(req, timeout=120))
    after = p.memory_info().rss
    print(f"RSS after 4 requests: {after / MiB:.1f} MiB ({(after - rss) / MiB:+.1f} MiB)")
    assert after - weights - pool <= RUNTIME_OVERHEAD_BYTES


def test_loading_copies_each_weight_once(model: Path) -> None:
    """Peak RSS while loading stays near the weights' size; the files are unmapped afterwards."""
    code = f"""
import sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0
import numpy, safetensors, nvllm.model.weights.folder as L
base = status("VmRSS")
config, w = L.load_weights({str(model)!r})
mapped = [l for l in open("/proc/self/maps") if ".safetensors" in l]
print(base, status("VmHWM"), status("VmRSS"), w.nbytes, len(mapped))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    base, peak, rss, weights, mapped = map(int, r.stdout.split())
    print(f"\nload: base {base / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, after {rss / MiB:.0f} MiB, "
          f"weights {weights / MiB:.0f} MiB")
    assert mapped == 0, "the safetensors files should be unmapped once the weights are laid out"
    # Without the intermediate copies (read, astype, concatenate, transpose) the peak is the weights plus
    # one chunk (16 MiB) of mapped pages and the allocator's slack.
    assert peak - base <= weights * 1.05 + 32 * MiB


def dry_run(model: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(model), "--dry-run", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("gib", [8, 16, 64])
def test_dry_run_plans_for_a_board_without_loading(model: Path, gib: int) -> None:
    r = dry_run(model, "--memory-gb", str(gib))
    assert r.returncode == 0, r.stderr
    c = load_config(model)
    bpb = KVCache.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim)
    per_seq = -(-min(4096, c.max_position_embeddings) // 16)  # the default max_model_len, in pages
    want = size_pool(bpb, gib * GiB - c.weight_bytes, 0.5, 1024 * MiB, 2048 * MiB, None, per_seq,
                     block_size=16, max_num_seqs=4)
    assert "weights: " in r.stdout and f"({c.weight_bytes} bytes held in memory)" in r.stdout
    assert f"in {want.num_blocks} pages of 16 tokens" in r.stdout
    assert f"context: {want.num_tokens} tokens fit" in r.stdout
    assert "resident after start-up" in r.stdout
    assert f"planned: {gib} GiB available less the weights" in r.stdout


def test_dry_run_pool_holds_no_more_than_the_settings_can_use(model: Path, tmp_path: Path) -> None:
    config = tmp_path / "nvllm.toml"
    config.write_text("[scheduler]\nmax_num_seqs = 2\n")
    r = dry_run(model, "--config", str(config), "--memory-gb", "16", "--max-model-len", "1024")
    assert r.returncode == 0, r.stderr
    # 2 sequences x 1024 tokens = 128 pages of 16, far under the 2 GiB cap.
    assert "in 128 pages of 16 tokens" in r.stdout and "context: 2048 tokens fit" in r.stdout
    assert "decided by demand" in r.stdout
    assert "demand: max_num_seqs 2 x 64 blocks per max_model_len sequence = 128 blocks" in r.stdout


def test_dry_run_on_this_machine_loads_and_sizes(model: Path) -> None:
    r = dry_run(model, "--num-blocks", "64", "--max-model-len", "1024")
    assert r.returncode == 0, r.stderr
    assert "pool:" in r.stdout and "in 64 pages of 16 tokens" in r.stdout and "context: 1024 tokens fit" in r.stdout
    assert re.search(r"startup: weights and tokenizer loaded in [\d.]+ s", r.stdout)


def test_memory_gb_must_be_positive(model: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(model), "--memory-gb", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--memory-gb N needs N > 0" in r.stderr


def rss() -> int:
    return psutil.Process().memory_info().rss


def pool_of(mib: int) -> KVCache:
    """A KVCache of about mib MiB (4 layers of 4 KV heads of 64: 128 KiB a block)."""
    return KVCache(num_layers=4, num_blocks=mib * 8, block_size=16, num_kv_heads=4, head_dim=64)


@pytest.mark.parametrize("flags", ["mmap", "mmap without MAP_POPULATE", "no mmap flags"])
def test_pool_is_zeroed_and_resident_when_made(flags: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page is backed when the constructor returns, and using all of it adds nothing."""
    if flags == "mmap without MAP_POPULATE":
        monkeypatch.setattr(kv_cache, "_MAP_POPULATE", 0)
    elif flags == "no mmap flags":
        monkeypatch.setattr(kv_cache, "_MAP_ANONYMOUS", None)
    before = rss()
    kv = pool_of(64)
    made = rss()
    assert kv.nbytes == 64 * MiB and kv.pool.shape == (4, 2, 512, 16, 4, 64) and kv.pool.dtype == "float32"
    assert kv.pool.flags.c_contiguous and kv.pool.flags.writeable
    assert not kv.pool.any(), "the pool starts zeroed"
    print(f"\n{flags}: {kv.populated_by}; RSS +{(made - before) / MiB:.1f} MiB for a {kv.nbytes / MiB:.0f} MiB pool")
    if flags != "no mmap flags":
        # A fresh mapping: every page counts. np.zeros may reuse memory this process freed before
        # (already resident), so there only "no growth under use" below can be asserted.
        assert made - before >= kv.nbytes * 0.98, f"only {(made - before) / MiB:.1f} MiB became resident"
    keys, values = kv.pool[3, 0], kv.pool[3, 1]
    keys[...] = 1.0
    values[...] = 2.0
    kv.pool[:3] = 3.0
    assert rss() - made <= 4 * MiB, "writing the whole pool made more pages resident"
    assert keys[511, 15, 3, 63] == 1.0 and values[0, 0, 0, 0] == 2.0 and kv.pool[0, 0, 0, 0, 0, 0] == 3.0


def test_pool_memory_is_returned_when_dropped() -> None:
    kv = pool_of(64)
    keys = kv.pool[0, 0]
    held = rss()
    del kv
    assert keys[0, 0, 0, 0] == 0.0  # a view keeps the pages mapped
    del keys
    assert held - rss() >= 60 * MiB
