"""model.threads: the matmuls' thread count, and the CPUs the process may use that its default comes
from (nvllm/cgroup.py: the affinity mask capped by the cgroup's CPU quota).

As in test_memory.py, each cgroup test lays out a fake /proc and /sys tree in tmp_path; the affinity is
given, so the figures do not depend on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvllm.cgroup import CpuCount, cpu_quota, usable_cpus, whole_cpus


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def v2_cpu(root: Path, rel: str, cpu_max: str | None) -> None:
    base = f"sys/fs/cgroup/{rel}".rstrip("/")
    (root / base).mkdir(parents=True, exist_ok=True)
    if cpu_max is not None:
        put(root, f"{base}/cpu.max", cpu_max)


def v1_cpu(root: Path, rel: str, quota: int, period: int = 100000, mount: str = "cpu,cpuacct") -> None:
    base = f"sys/fs/cgroup/{mount}/{rel}".rstrip("/")
    put(root, f"{base}/cpu.cfs_quota_us", str(quota))
    put(root, f"{base}/cpu.cfs_period_us", str(period))


class TestCgroupV2:
    def test_a_quota_caps_the_affinity(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/system.slice/nvllm.service")
        v2_cpu(tmp_path, "system.slice/nvllm.service", "200000 100000")
        got = usable_cpus(tmp_path, affinity=8)
        assert got == CpuCount(2, "cgroup v2 /system.slice/nvllm.service quota 2.00 CPUs (affinity 8 cores)")

    def test_max_means_no_quota(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cpu(tmp_path, "app", "max 100000")
        assert cpu_quota(tmp_path) is None
        assert usable_cpus(tmp_path, affinity=6) == CpuCount(6, "affinity 6 cores")

    def test_a_parent_slices_quota_binds_the_child(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/edge.slice/nvllm.service")
        v2_cpu(tmp_path, "edge.slice", "150000 100000")
        v2_cpu(tmp_path, "edge.slice/nvllm.service", "400000 100000")
        assert cpu_quota(tmp_path) == (1.5, "cgroup v2 /edge.slice")
        assert usable_cpus(tmp_path, affinity=8).count == 2

    def test_the_affinity_wins_when_it_is_smaller(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cpu(tmp_path, "app", "400000 100000")
        assert usable_cpus(tmp_path, affinity=2) == CpuCount(2, "affinity 2 cores")

    def test_container_namespace_falls_back_to_the_mount_point(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/docker/abc123")
        v2_cpu(tmp_path, "", "100000 100000")
        assert usable_cpus(tmp_path, affinity=4).count == 1

    @pytest.mark.parametrize("text", ["", "max", "abc 100000", "100000 0", "-5 100000", "1 2 3"])
    def test_unreadable_or_odd_files_set_no_quota(self, tmp_path: Path, text: str) -> None:
        put(tmp_path, "proc/self/cgroup", "0::/app")
        v2_cpu(tmp_path, "app", text)
        assert usable_cpus(tmp_path, affinity=3).count == 3


class TestCgroupV1:
    def test_quota_over_period(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "5:devices:/\n4:memory:/nvllm\n3:cpu,cpuacct:/nvllm")
        v1_cpu(tmp_path, "nvllm", quota=300000, period=100000)
        got = usable_cpus(tmp_path, affinity=8)
        assert got.count == 3 and got.source.startswith("cgroup v1 /nvllm quota 3.00 CPUs")

    def test_minus_one_means_no_quota(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "3:cpu,cpuacct:/nvllm")
        v1_cpu(tmp_path, "nvllm", quota=-1)
        v1_cpu(tmp_path, "", quota=-1)
        assert usable_cpus(tmp_path, affinity=4) == CpuCount(4, "affinity 4 cores")

    def test_cpu_mounted_on_its_own(self, tmp_path: Path) -> None:
        # Some kernels mount cpu and cpuacct apart, as this file's two lines say.
        put(tmp_path, "proc/self/cgroup", "2:cpuacct:/\n1:cpu:/fleet/nvllm")
        v1_cpu(tmp_path, "fleet", quota=50000, period=100000, mount="cpu")
        assert cpu_quota(tmp_path) == (0.5, "cgroup v1 /fleet")
        assert usable_cpus(tmp_path, affinity=4).count == 1

    def test_hybrid_hierarchy_reads_the_v1_cpu_controller(self, tmp_path: Path) -> None:
        put(tmp_path, "proc/self/cgroup", "3:cpu,cpuacct:/nvllm\n0::/nvllm")
        v1_cpu(tmp_path, "nvllm", quota=100000)
        v2_cpu(tmp_path, "nvllm", "400000 100000")
        assert usable_cpus(tmp_path, affinity=8).count == 1


class TestNoCgroup:
    def test_without_proc_self_cgroup_the_affinity_stands(self, tmp_path: Path) -> None:
        assert usable_cpus(tmp_path, affinity=5) == CpuCount(5, "affinity 5 cores")
        assert usable_cpus(tmp_path, affinity=1) == CpuCount(1, "affinity 1 core")

    def test_this_machine_gives_at_least_one(self) -> None:
        got = usable_cpus()
        assert got.count >= 1 and got.source


@pytest.mark.parametrize(("quota", "cores"), [(0.01, 1), (0.5, 1), (1.0, 1), (1.49, 1), (1.5, 2), (2.2, 2),
                                              (2.5, 3), (7.9, 8)])
def test_a_quota_rounds_to_the_nearest_whole_core_at_least_one(quota: float, cores: int) -> None:
    assert whole_cpus(quota) == cores


def test_the_default_thread_count_follows_the_affinity_mask() -> None:
    """model.threads = 0 in a process pinned to one core: one thread (never zero), for BLAS and the
    in-place kernels alike."""
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from nvllm.model.kernels import threads; from nvllm.cgroup import usable_cpus; "
            "print(usable_cpus().count, threads.default(), threads.count)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1"]


def test_model_threads_sets_blas_and_the_in_place_kernels_together(tiny_models) -> None:
    from threadpoolctl import threadpool_info

    from nvllm import LLM
    from nvllm.model.kernels import threads

    llm = LLM(tiny_models["tiny-llama"], num_blocks=16, max_model_len=64, threads=1)
    assert llm.engine.threads == 1 and threads.count == 1
    assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
    llm = LLM(tiny_models["tiny-llama"], num_blocks=16, max_model_len=64)     # 0: the default
    assert llm.engine.threads == threads.default()
    assert threads.count == min(threads.default(), threads.MAX)


def test_blas_threads_sleep_soon_unless_the_environment_says_otherwise():
    # OpenBLAS's spinning threads took the cores from the kernels' pool (nvllm/__init__.py): importing
    # nvllm, before NumPy, makes them sleep after 2^4 cycles; a value the environment gives is kept
    probe = ("import os, nvllm, numpy; "
             "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OPENBLAS_THREAD_TIMEOUT": "12"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "12"


@pytest.mark.parametrize(("cpus", "setting", "n", "line"), [
    # a 2-core board: one thread computes, the engine's; it once read "0 matmul threads" (model.threads)
    (CpuCount(2, "affinity 2 cores"), 0, None,
     "1 matmul thread (the engine's own; model.threads = 0: affinity 2 cores, less one for the event loop)"),
    (CpuCount(4, "affinity 4 cores"), 0, None,
     "3 matmul threads (the engine's and 2 more; model.threads = 0: affinity 4 cores, less one for the event loop)"),
    (CpuCount(1, "affinity 1 core"), 0, None,
     "1 matmul thread (the engine's own; model.threads = 0: affinity 1 core, none to spare)"),
    (CpuCount(2, "cgroup v2 /x quota 2.00 CPUs (affinity 8 cores)"), 0, None,
     "1 matmul thread (the engine's own; model.threads = 0: cgroup v2 /x quota 2.00 CPUs (affinity 8 cores), "
     "less one for the event loop)"),
    (CpuCount(2, "affinity 2 cores"), 2, 2, "2 matmul threads (the engine's and 1 more; model.threads = 2)"),
    (CpuCount(2, "affinity 2 cores"), 100, 100,
     "64 matmul threads (the engine's and 63 more; model.threads = 100, the C team's most 64)"),
])
def test_the_start_up_line_says_how_many_threads_compute_and_why(cpus, setting, n, line) -> None:
    from nvllm.model.kernels import threads

    assert threads.describe(threads.default(cpus) if n is None else n, setting, cpus) == line
