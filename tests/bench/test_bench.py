"""nvllm bench: every figure it promises is there, with its floors, in-process and through a daemon."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvllm import cli
from nvllm.bench import sampler, throughput
from nvllm.bench.__main__ import main as bench_main
from nvllm.bench.counts import resolved, thread_counts
from nvllm.bench.floors import Floors
from nvllm.bench.progress import Progress
from nvllm.bench.report import format_runs, format_table
from nvllm.model.kernels import matmul
from nvllm.model.kernels import threads as kernel_threads


def test_in_process_bench_reports_figures_beside_floors(tiny_models):
    results = throughput.bench_in_process(tiny_models["tiny-llama"], [1, 4], prompt_len=20, gen_len=6,
                                          prefill_lens=[16, 48], progress=Progress(enabled=False), threads=[2, 1])
    # one whole run per count, in the order given, each beside floors of its own
    assert [r["machine"]["threads"] for r in results] == [2, 1]
    for r in results:
        threads = r["machine"]["threads"]
        assert set(r) >= {"machine", "model", "floors", "prefill", "decode", "peak_rss_mib"}
        # the pool is what the run needs, no more, and it held every run: nothing was preempted
        assert r["pool_blocks"] == max(4 * 2, 4) and r["preemptions"] == 0
        assert 64 <= r["floors"]["bandwidth_buffer_mib"] <= 256
        assert r["machine"]["cores"] >= 1
        assert r["floors"]["memory_bandwidth_gbs"] > 0 and r["floors"]["sgemm_gflops"] > 0
        # every format the model holds has its one-row rate, in all and per thread, and as a fraction of the
        # bandwidth measured at the same count
        rows = r["floors"]["one_row_gbs"]
        assert set(rows) == set(r["model"]["weight_formats"]) and rows
        for v in rows.values():
            assert v["gbs"] > 0 and v["of_bandwidth"] > 0
            assert v["gbs_per_thread"] == pytest.approx(v["gbs"] / threads, abs=0.01)
            assert v["of_bandwidth"] == pytest.approx(v["gbs"] / r["floors"]["memory_bandwidth_gbs"], abs=0.002)
        if matmul.int_variant() not in ("", "float"):
            peak = r["floors"]["int_peak"]
            assert peak["variant"] == matmul.int_variant() and peak["gops"] > 0
            assert peak["gops_per_thread"] == pytest.approx(peak["gops"] / threads, abs=0.1)
        assert [p["prompt_tokens"] for p in r["prefill"]] == [16, 48]
        for p in r["prefill"]:
            assert p["tokens_per_s"] > 0 and p["matmul_floor_s"] > 0 and p["fraction_of_floor"] > 0
            if "int_peak" in r["floors"]:   # the step's multiply-adds at the integer peak, beside the time taken
                want = p["int_peak_s"] / p["seconds"]
                assert p["int_peak_s"] > 0 and p["fraction_of_int_peak"] == pytest.approx(want, abs=0.002)
        if "int_peak" in r["floors"]:
            assert r["prefill"][1]["int_peak_s"] > 2 * r["prefill"][0]["int_peak_s"]   # 48 tokens' work, not 16's
        assert [d["concurrency"] for d in r["decode"]] == [1, 4]
        for d in r["decode"]:
            for key in ("tokens_per_s", "fraction_of_floor", "fraction_of_roofline", "ttft_ms_p50", "ttft_ms_p99",
                        "itl_ms_p50", "itl_ms_p99", "floor_tokens_per_s"):
                assert d[key] > 0, key
        table = format_table(r)
        assert "of floor" in table and "peak resident memory" in table and "one row of x" in table
        assert "a thread" in table
    assert kernel_threads.count == 1   # the kernels were left at the last count run


def test_thread_counts_are_a_list_in_order_each_once():
    assert thread_counts("2") == [2] and thread_counts("0") == [0]
    assert thread_counts("1,2,4") == [1, 2, 4] and thread_counts(" 4, 1,4,2 ,1") == [4, 1, 2]
    too_many = str(kernel_threads.MAX + 1)
    for bad, why in (("", "not a whole number"), ("1,,2", "not a whole number"), ("1,x", "'x'"),
                     ("2.5", "not a whole number"), ("-1", "out of range"), (too_many, "out of range")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            thread_counts(bad)
    # 0 is the default count, and runs once beside that count named as a number
    n = kernel_threads.default()
    assert resolved([0]) == [n] and resolved([n, 0, 3, 3]) == list(dict.fromkeys([n, 3]))


def test_cli_names_threads_when_a_count_is_bad(capsys):
    assert cli.build_parser().parse_args(["bench", "--threads", "1,2,1"]).threads == [1, 2]
    assert cli.build_parser().parse_args(["bench"]).threads == [0]
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["bench", "--threads", "1,two"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--threads" in err and "'two'" in err and "not a whole number" in err
    # the other benches run at one count
    assert cli.main(["bench", "--speculation", "--threads", "1,2"]) == 2
    assert "--threads takes one count" in capsys.readouterr().err


def test_the_integer_peak_time_is_the_steps_multiply_adds_at_the_peak():
    f = Floors(bandwidth_gbs=10.0, sgemm_gflops=100.0, weight_bytes=1000, flops_per_token=2e6)
    # 10 rows through the body (1.5 MFLOP each), one through lm_head (0.5 MFLOP), at 100 GOP/s
    assert f.int_peak_s(10, 1, 5e5, 100.0) == pytest.approx((10 * 1.5e6 + 5e5) / 1e11)


def _fake_result(threads: int) -> dict[str, Any]:
    return {"machine": {"cpu": "c", "arch": "a", "cores": 2, "memory_gib": 1, "numpy": "n", "blas": {},
                        "threads": threads},
            "model": {"path": "m", "parameters": 1e6, "weight_bytes": 2**20, "weight_formats": {"Q8_0": 1}},
            "floors": {"memory_bandwidth_gbs": 10.0, "sgemm_gflops": 100.0, "weight_read_ms": 0.1,
                       "int_peak": {"variant": "v", "gops": 50.0 * threads, "gops_per_thread": 50.0},
                       "one_row_gbs": {"Q8_0": {"gbs": 4.0 * threads, "gbs_per_thread": 4.0,
                                                "of_bandwidth": 0.4 * threads}}},
            "prefill": [], "decode": [], "peak_rss_mib": 100.0}


def test_one_count_prints_one_object_several_a_list(monkeypatch, capsys):
    def fake(model_dir, concurrency, prompt_len, gen_len, prefill_lens, progress, threads, *rest):
        return [_fake_result(n) for n in threads]
    monkeypatch.setattr(throughput, "bench_in_process", fake)
    throughput.run(Path("m"), [1], 8, 4, None, True, [16], [2])
    one = json.loads(capsys.readouterr().out)
    assert isinstance(one, dict) and one["machine"]["threads"] == 2   # the shape scripts read (peers/side-by-side.sh)
    throughput.run(Path("m"), [1], 8, 4, None, True, [16], [1, 2])
    several = json.loads(capsys.readouterr().out)
    assert [r["machine"]["threads"] for r in several] == [1, 2]
    throughput.run(Path("m"), [1], 8, 4, None, False, [16], [1, 2])
    text = capsys.readouterr().out
    assert text.index("== 1 thread ==") < text.index("== 2 threads ==")
    assert "Q8_0 8.0 GB/s (4.0 a thread, 0.8 of bandwidth)" in text
    assert "integer peak 100.0 GOP/s (50.0 a thread, v)" in text
    assert "==" not in format_runs([_fake_result(2)])


def test_cli_bench_prints_one_json_object(tiny_models):
    res = subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", "--model", str(tiny_models["tiny-qwen2"]),
                          "--concurrency", "2", "--prompt-len", "8", "--gen-len", "4", "--prefill-len", "16",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["decode"][0]["concurrency"] == 2 and obj["prefill"][0]["prompt_tokens"] == 16
    bad = subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", "--concurrency", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--concurrency" in bad.stderr


def test_sampler_bench_times_every_case():
    results = sampler.bench_sampler(rows=3, vocab=300, repeats=2)
    assert [r["case"] for r in results] == list(sampler.SAMPLER_CASES)
    assert all(0 < r["min_ms"] <= r["median_ms"] for r in results)
    assert bench_main(["no-such-bench"]) == 2


def test_speculation_bench_times_each_task_with_and_without(tiny_models):
    res = subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", "--speculation", "--model",
                          str(tiny_models["tiny-llama"]), "--gen-len", "24", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    from nvllm.bench.speculation import TASKS, format_speculation
    assert [t["task"] for t in obj["tasks"]] == list(TASKS) and obj["weight_read_ms"] > 0
    ran = [t for t in obj["tasks"] if "skipped" not in t]
    assert ran and all("max_model_len" in t["skipped"] for t in obj["tasks"] if t not in ran)
    for t in ran:
        # greedy either way: the same tokens, in no more steps with proposals than without
        assert t["tokens"] > 0 and t["steps_with"] <= t["steps_without"] <= t["tokens"]
        assert t["itl_ms_without"] > 0 and t["itl_ms_with"] > 0 and 0 <= t["acceptance_rate"] <= 1
    assert "speed-up" in format_speculation(obj)


def test_speculation_bench_takes_a_draft_model(tiny_models):
    tiny = str(tiny_models["tiny-llama"])
    res = subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", "--speculation", "--model", tiny,
                          "--draft-model", tiny, "--gen-len", "24", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["method"] == f"draft model {tiny}"
    ran = [t for t in obj["tasks"] if "skipped" not in t]
    assert ran and all(t["steps_with"] <= t["steps_without"] for t in ran)
    alone = subprocess.run([sys.executable, "-m", "nvllm.cli", "bench", "--model", tiny, "--draft-model", tiny],
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 2 and "--speculation" in alone.stderr


def test_structured_bench_times_each_mode_and_the_compile(tiny_models):
    from nvllm.bench.structured import MODES, bench_structured, format_structured
    from nvllm.config import load_settings
    from nvllm.engine.assembly.factory import build_engine

    engine = build_engine(load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"])},
                                                   "cache": {"num_blocks": 64}}))
    r = bench_structured(engine, [1, 2], steps=3, rounds=1)
    assert [row["rows"] for row in r["rows"]] == [1, 2]
    for row in r["rows"]:
        assert all(row[f"{m}_ms"] > 0 and row[f"{m}_cpu_ms"] >= 0 for m in MODES)
        assert row["fill_ms"] > 0 and row["sample_ms"] > 0     # the fill the step calls is the one timed
    assert r["compile"]["tokenizer_ms"] > 0 and r["compile"]["cold_ms"] >= r["compile"]["cached_ms"] > 0
    assert engine.structured_overlap and not engine.has_unfinished()   # left as it was found
    assert "schema compile" in format_structured(r)


def test_the_drone_querys_time_to_first_token_splits_from_the_metrics_text():
    from nvllm.bench.query import SPLIT, histogram_totals, server_split

    def text(ttft: float, queue: float, prefill: float, first: float, n: int) -> str:
        return "\n".join(f'{name}_sum{{model_name="m"}} {v}\n{name}_count{{model_name="m"}} {n}'
                         for name, v in (("vllm:time_to_first_token_seconds", ttft),
                                         ("vllm:request_queue_time_seconds", queue),
                                         ("vllm:request_prefill_time_seconds", prefill),
                                         ("nvllm:request_first_decode_seconds", first)))

    before = histogram_totals(text(1.0, 0.1, 0.5, 0.2, 4))
    after = histogram_totals(text(1.6, 0.12, 0.9, 0.3, 6))
    s = server_split(before, after)
    assert s == pytest.approx({"ttft_ms": 300.0, "queue_ms": 10.0, "prefill_ms": 200.0, "first_decode_ms": 50.0,
                               "before_engine_ms": 90.0})
    assert server_split(after, after) == {}   # no request between the readings: nothing to split
    assert histogram_totals("") == {part: (0.0, 0.0) for part in SPLIT}
