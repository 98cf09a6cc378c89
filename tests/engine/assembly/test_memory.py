"""Available memory under cgroups, KV pool sizing, and the memory-pressure watchdog.

The cgroup tests build a fake /proc and /sys tree in tmp_path; the watchdog tests feed fake
readings. Nothing here allocates memory to create pressure.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from nvllm.engine.assembly.memory import (
    GiB,
    MemoryReading,
    MiB,
    PoolTooSmall,
    available_memory,
    cgroup_headroom,
    size_pool,
)
from nvllm.model.kv_cache import KVCache
from nvllm.server.board.memory_watchdog import MemoryWatchdog

HOST = 8 * GiB
V1_UNLIMITED = "9223372036854771712"


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def v2_cgroup(root: Path, rel: str, *, mem_max: str | None = None, mem_high: str | None = None,
              current: int | None = None, inactive_file: int | None = None) -> None:
    """Files of one cgroup v2 directory (rel is the cgroup path without the leading /)."""
    base = f"sys/fs/cgroup/{rel}".rstrip("/")
    (root / base).mkdir(parents=True, exist_ok=True)
    if mem_max is not None:
        put(root, f"{base}/memory.max", mem_max)
    if mem_high is not None:
        put(root, f"{base}/memory.high", mem_high)
    if current is not None:
        put(root, f"{base}/memory.current", str(current))
    if inactive_file is not None:
        put(root, f"{base}/memory.stat", f"anon 1234\nfile 999\ninactive_file {inactive_file}\nactive_file 5")


def v1_cgroup(root: Path, rel: str, *, limit: str, usage: int, total_inactive_file: int = 0) -> None:
    base = f"sys/fs/cgroup/memory/{rel}".rstrip("/")
    put(root, f"{base}/memory.limit_in_bytes", limit)
    put(root, f"{base}/memory.usage_in_bytes", str(usage))
    put(root, f"{base}/memory.stat", f"cache 1\ninactive_file {total_inactive_file}\n"
                                      f"total_inactive_file {total_inactive_file}")


class TestCgroupV2:
    def test_headroom_is_the_lower_of_max_and_high_minus_current(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/system.slice/nvllm.service")
        v2_cgroup(tmp_path, "system.slice/nvllm.service", mem_max=str(2 * GiB), mem_high=str(1536 * MiB),
                  current=512 * MiB, inactive_file=0)
        reading = available_memory(tmp_path, host_available=HOST)
        assert reading.available_bytes == 1 * GiB
        assert "cgroup v2 /system.slice/nvllm.service" in reading.source

    def test_max_strings_mean_no_limit(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/system.slice/nvllm.service")
        v2_cgroup(tmp_path, "system.slice/nvllm.service", mem_max="max", mem_high="max", current=GiB)
        assert cgroup_headroom(tmp_path) is None
        assert available_memory(tmp_path, host_available=HOST) == MemoryReading(HOST, "host (psutil)")

    def test_high_alone_limits_when_max_is_unset(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cgroup(tmp_path, "app", mem_max="max", mem_high=str(GiB), current=256 * MiB)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == 768 * MiB

    def test_limit_on_a_parent_slice_binds_the_child(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/edge.slice/nvllm.service")
        v2_cgroup(tmp_path, "edge.slice", mem_max=str(GiB), mem_high="max", current=900 * MiB)
        v2_cgroup(tmp_path, "edge.slice/nvllm.service", mem_max="max", mem_high="max", current=100 * MiB)
        reading = available_memory(tmp_path, host_available=HOST)
        assert reading.available_bytes == 124 * MiB
        assert "/edge.slice " in reading.source

    def test_the_tightest_level_wins(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/a/b")
        v2_cgroup(tmp_path, "a", mem_max=str(4 * GiB), current=GiB)  # 3 GiB left
        v2_cgroup(tmp_path, "a/b", mem_max=str(2 * GiB), current=GiB)  # 1 GiB left
        reading = available_memory(tmp_path, host_available=HOST)
        assert reading.available_bytes == GiB
        assert "/a/b " in reading.source

    def test_inactive_page_cache_counts_as_available(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cgroup(tmp_path, "app", mem_max=str(2 * GiB), current=GiB + 300 * MiB, inactive_file=300 * MiB)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == GiB

    def test_host_wins_when_it_has_less_than_the_cgroup_allows(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cgroup(tmp_path, "app", mem_max=str(16 * GiB), current=GiB)
        assert available_memory(tmp_path, host_available=HOST) == MemoryReading(HOST, "host (psutil)")

    def test_usage_above_the_limit_reads_as_zero(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cgroup(tmp_path, "app", mem_max="max", mem_high=str(GiB), current=GiB + MiB)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == 0

    def test_container_namespace_falls_back_to_the_mount_point(self, tmp_path: Path) -> None:
        # Without a cgroup namespace the path names the host's hierarchy, which the container's
        # /sys/fs/cgroup (its own cgroup) does not contain.
        put(tmp_path, "proc/self/cgroup", "0::/docker/abc123")
        v2_cgroup(tmp_path, "", mem_max=str(GiB), current=512 * MiB)
        reading = available_memory(tmp_path, host_available=HOST)
        assert reading.available_bytes == 512 * MiB
        assert "cgroup v2 / " in reading.source

    def test_dot_dot_in_the_path_stays_inside_the_mount(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/../../etc")
        v2_cgroup(tmp_path, "", mem_max=str(GiB), current=0)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == GiB


class TestCgroupV1:
    def test_limit_minus_usage_less_inactive_cache(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "5:devices:/\n4:memory:/nvllm\n1:cpu,cpuacct:/")
        v1_cgroup(tmp_path, "nvllm", limit=str(GiB), usage=600 * MiB, total_inactive_file=100 * MiB)
        reading = available_memory(tmp_path, host_available=HOST)
        assert reading.available_bytes == 524 * MiB
        assert "cgroup v1 /nvllm" in reading.source

    def test_huge_limit_means_unlimited(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "4:memory:/nvllm")
        v1_cgroup(tmp_path, "nvllm", limit=V1_UNLIMITED, usage=GiB)
        v1_cgroup(tmp_path, "", limit=V1_UNLIMITED, usage=2 * GiB)
        assert available_memory(tmp_path, host_available=HOST) == MemoryReading(HOST, "host (psutil)")

    def test_parent_limit_binds(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "4:memory:/fleet/nvllm")
        v1_cgroup(tmp_path, "fleet", limit=str(2 * GiB), usage=GiB + 512 * MiB)
        v1_cgroup(tmp_path, "fleet/nvllm", limit=V1_UNLIMITED, usage=GiB)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == 512 * MiB

    def test_hybrid_hierarchy_reads_the_v1_memory_controller(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "4:memory:/nvllm\n0::/nvllm")
        v1_cgroup(tmp_path, "nvllm", limit=str(GiB), usage=0)
        v2_cgroup(tmp_path, "nvllm", mem_max=str(4 * GiB), current=0)
        assert available_memory(tmp_path, host_available=HOST).available_bytes == GiB


class TestNoCgroup:
    def test_without_proc_self_cgroup_the_host_figure_stands(self, tmp_path: Path) -> None:
        assert available_memory(tmp_path, host_available=HOST) == MemoryReading(HOST, "host (psutil)")

    def test_root_cgroup_without_limit_files(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/")
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        assert cgroup_headroom(tmp_path) is None

    def test_this_machine_gives_a_positive_reading(self) -> None:
        reading = available_memory()
        assert reading.available_bytes > 0 and reading.source


BPB = 3 * MiB  # bytes per block in the sizing tests


def sizing(**kw: Any):
    args: dict[str, Any] = dict(bytes_per_block=BPB, available_bytes=10 * GiB, memory_fraction=0.5,
                reserve_bytes=GiB, max_pool_bytes=0, num_blocks_override=None,
                min_blocks_needed=16, block_size=16, source="host (psutil)")
    args.update(kw)
    return size_pool(**args)


class TestSizePool:
    def test_fraction_of_available_after_reserve(self) -> None:
        s = sizing()
        assert s.budget_bytes == int(9 * GiB * 0.5)
        assert s.num_blocks == int(9 * GiB * 0.5) // BPB
        assert s.num_tokens == s.num_blocks * 16
        assert s.pool_bytes <= s.budget_bytes < s.pool_bytes + BPB
        assert not s.overridden

    def test_cap_wins_when_lower(self) -> None:
        s = sizing(max_pool_bytes=300 * MiB)
        assert s.budget_bytes == 300 * MiB and s.num_blocks == 100

    def test_override_wins_even_above_the_budget(self) -> None:
        s = sizing(num_blocks_override=5000, max_pool_bytes=300 * MiB)
        assert s.num_blocks == 5000 and s.overridden
        line = s.log_line()
        assert "set by cache.num_blocks" in line and "above the sizing budget" in line

    def test_exactly_one_sequence_fits(self) -> None:
        s = sizing(max_pool_bytes=16 * BPB, min_blocks_needed=16)
        assert s.num_blocks == 16

    def test_log_line_states_the_whole_arithmetic(self) -> None:
        s = sizing(max_pool_bytes=4 * GiB)
        line = s.log_line()
        for part in (f"{s.num_blocks} blocks", "x 16 tokens", f"= {s.num_tokens} tokens",
                     f"{s.pool_bytes / GiB:.2f} GiB", f"{BPB} bytes per block",
                     "available 10.00 GiB", "[host (psutil)]", "reserve 1.00 GiB", "= 9.00 GiB",
                     "fraction 0.5", "cap 4.00 GiB", "budget 4.00 GiB"):
            assert part in line, (part, line)
        assert "cap none" in sizing().log_line()

    def test_too_small_names_max_model_len_and_the_fraction_needed(self) -> None:
        # 2 GiB usable x 0.1 = 204.8 MiB -> 68 blocks (1088 tokens); 8000 tokens need 500 blocks.
        with pytest.raises(PoolTooSmall) as err:
            sizing(available_bytes=3 * GiB, memory_fraction=0.1, min_blocks_needed=500,
                   max_model_len=8000)
        msg = str(err.value)
        assert "scheduler.max_model_len=8000 needs 500 blocks" in msg
        assert "holds 68 blocks (1088 tokens of one sequence)" in msg
        assert "lower scheduler.max_model_len to 1088 or less" in msg
        # 500 x 3 MiB = 1500 MiB of 2048 MiB usable -> fraction 0.74 (rounded up).
        assert "raise cache.memory_fraction to 0.74" in msg
        assert "lower cache.reserve_mb (now 1024)" in msg
        assert "free memory" in msg and "3.00 GiB is" in msg
        assert "max_pool_mb" not in msg  # no cap was set

    def test_too_small_under_a_cap_asks_to_raise_the_cap_not_to_free_memory(self) -> None:
        with pytest.raises(PoolTooSmall) as err:
            sizing(max_pool_bytes=30 * MiB, min_blocks_needed=20)
        msg = str(err.value)
        assert "raise cache.max_pool_mb to 60 or more" in msg
        assert "lower scheduler.max_model_len to 160 or less" in msg
        assert "free memory" not in msg and "memory_fraction" not in msg

    def test_too_small_when_the_reserve_exceeds_available(self) -> None:
        with pytest.raises(PoolTooSmall) as err:
            sizing(available_bytes=GiB, reserve_bytes=2 * GiB)
        msg = str(err.value)
        assert "holds 0 blocks" in msg and "lower cache.reserve_mb (now 2048)" in msg
        assert "max_model_len to" not in msg  # no length would fit in an empty pool

    def test_too_small_override_asks_for_more_blocks(self) -> None:
        with pytest.raises(PoolTooSmall) as err:
            sizing(num_blocks_override=10, min_blocks_needed=500, max_model_len=8000)
        msg = str(err.value)
        assert "raise cache.num_blocks to 500 or more" in msg
        assert "lower scheduler.max_model_len to 160 or less" in msg


class TestDemandCap:
    """The pool never holds more than max_num_seqs sequences of max_model_len can use at once."""

    def test_demand_wins_when_lower_than_the_budget(self) -> None:
        s = sizing(max_num_seqs=2, min_blocks_needed=16)  # budget 1536 blocks, demand 32
        assert s.num_blocks == 32 and s.demand_blocks == 32 and s.bound == "demand"
        line = s.log_line()
        assert "decided by demand" in line
        assert "demand: max_num_seqs 2 x 16 blocks per max_model_len sequence = 32 blocks" in line
        assert "budget 4.50 GiB" in line  # the memory arithmetic is still stated

    def test_demand_above_the_budget_changes_nothing(self) -> None:
        plain, capped = sizing(), sizing(max_num_seqs=1000)
        assert capped.num_blocks == plain.num_blocks == int(9 * GiB * 0.5) // BPB
        assert capped.bound == plain.bound == "memory"
        assert "decided by memory" in capped.log_line() and "= 16000 blocks" in capped.log_line()

    def test_the_cap_is_named_when_it_decides(self) -> None:
        s = sizing(max_pool_bytes=300 * MiB, max_num_seqs=1000)
        assert s.num_blocks == 100 and s.bound == "cap"
        assert "decided by the cap (cache.max_pool_mb)" in s.log_line()

    def test_demand_under_a_cap(self) -> None:
        s = sizing(max_pool_bytes=300 * MiB, max_num_seqs=2)
        assert s.num_blocks == 32 and s.bound == "demand"

    def test_override_beats_demand(self) -> None:
        s = sizing(num_blocks_override=5000, max_num_seqs=1)
        assert s.num_blocks == 5000 and s.bound == "cache.num_blocks"
        assert "set by cache.num_blocks" in s.log_line()

    def test_one_sequence_always_fits_the_demand(self) -> None:
        s = sizing(max_num_seqs=1, min_blocks_needed=16)
        assert s.num_blocks == 16 and s.bound == "demand"

    def test_without_max_num_seqs_there_is_no_demand_line(self) -> None:
        s = sizing()
        assert s.demand_blocks == 0 and "demand" not in s.log_line()

    def test_rejects_no_sequences(self) -> None:
        with pytest.raises(ValueError):
            sizing(max_num_seqs=0)

    def test_smollm2_defaults_still_take_the_2_gib_cap(self) -> None:
        # SmolLM2-135M: 30 layers, 3 KV heads of 64; the defaults: 32 sequences of 4096 tokens want
        # 8192 blocks (5.62 GiB), more than the 2 GiB cap's 2912, so the cap decides.
        bpb = KVCache.bytes_per_block(30, 16, 3, 64)
        s = size_pool(bpb, 20 * GiB, 0.5, GiB, 2048 * MiB, None, 4096 // 16, block_size=16,
                      max_model_len=4096, max_num_seqs=32)
        assert (bpb, s.demand_blocks, s.num_blocks, s.num_tokens) == (737280, 8192, 2912, 46592)
        assert s.bound == "cap"


class FakeMemory:
    def __init__(self, mib: int) -> None:
        self.mib = mib
        self.fail = False

    def __call__(self) -> MemoryReading:
        if self.fail:
            raise OSError("cannot read")
        return MemoryReading(self.mib * MiB, "fake")


def watchdog(memory: FakeMemory, events: list[tuple[bool, str]] | None = None,
             interval_s: float = 1.0) -> MemoryWatchdog:
    on_change = None if events is None else (lambda admitting, reason: events.append((admitting, reason)))
    return MemoryWatchdog(memory, low_bytes=256 * MiB, high_bytes=512 * MiB,
                          interval_s=interval_s, on_change=on_change)


class TestMemoryWatchdog:
    def test_hysteresis_between_the_watermarks(self) -> None:
        memory = FakeMemory(1000)
        events: list[tuple[bool, str]] = []
        dog = watchdog(memory, events)
        states = []
        for mib in (1000, 200, 400, 512, 513, 300, 256, 255):
            memory.mib = mib
            states.append(dog.check_once())
        # Below low stops; between the marks keeps the state; strictly above high resumes;
        # exactly at a mark changes nothing.
        assert states == [True, False, False, False, True, True, True, False]
        assert [a for a, _ in events] == [False, True, False]
        assert events[1][1] == ""

    def test_reason_names_available_and_required_memory(self) -> None:
        memory = FakeMemory(180)
        events: list[tuple[bool, str]] = []
        dog = watchdog(memory, events)
        assert not dog.check_once()
        expected = ("available memory 180 MiB (fake) is below the low watermark 256 MiB; "
                    "admission resumes above 512 MiB")
        assert dog.reason == expected and events == [(False, expected)]
        memory.mib = 300  # still refusing: the reason follows the latest reading
        dog.check_once()
        assert dog.reason.startswith("available memory 300 MiB")
        assert dog.last_reading == MemoryReading(300 * MiB, "fake")
        memory.mib = 600
        assert dog.check_once() and dog.reason == ""

    def test_failed_read_keeps_the_state(self) -> None:
        memory = FakeMemory(100)
        dog = watchdog(memory)
        assert not dog.check_once()
        memory.fail = True
        assert not dog.check_once() and not dog.admitting

    def test_failing_callback_does_not_stop_the_watchdog(self) -> None:
        memory = FakeMemory(100)

        def boom(admitting: bool, reason: str) -> None:
            raise RuntimeError("callback bug")

        dog = MemoryWatchdog(memory, 256 * MiB, 512 * MiB, on_change=boom)
        assert not dog.check_once()
        memory.mib = 1000
        assert dog.check_once()

    def test_thread_follows_readings_and_stops(self) -> None:
        memory = FakeMemory(1000)
        changed = threading.Event()
        seen: list[bool] = []

        def on_change(admitting: bool, reason: str) -> None:
            seen.append(admitting)
            changed.set()

        dog = MemoryWatchdog(memory, 256 * MiB, 512 * MiB, interval_s=0.01, on_change=on_change)
        dog.start()
        try:
            assert dog.running and dog.admitting
            memory.mib = 100
            assert changed.wait(10), "watchdog thread never noticed low memory"
            assert not dog.admitting and "100 MiB" in dog.reason
            changed.clear()
            memory.mib = 1000
            assert changed.wait(10), "watchdog thread never noticed memory coming back"
            assert dog.admitting
        finally:
            dog.stop()
        assert not dog.running
        assert seen == [False, True]
        dog.stop()  # a second stop is harmless

    def test_start_takes_a_reading_at_once(self) -> None:
        dog = watchdog(FakeMemory(100), interval_s=3600)
        dog.start()
        try:
            assert not dog.admitting  # without waiting an interval
            with pytest.raises(RuntimeError):
                dog.start()
        finally:
            dog.stop()
        assert not dog.running

    def test_rejects_inverted_watermarks(self) -> None:
        with pytest.raises(ValueError):
            MemoryWatchdog(FakeMemory(1), low_bytes=512 * MiB, high_bytes=256 * MiB)
        with pytest.raises(ValueError):
            MemoryWatchdog(FakeMemory(1), 0, 0, interval_s=0)
