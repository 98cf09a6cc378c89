"""nvllm bench's result as a table for a terminal (--json prints the result itself), and the percentiles its
latencies are summed up by."""

from __future__ import annotations

from typing import Any

import numpy as np


def pct(values: list[float], q: float) -> float:
    """The q-th percentile of values; NaN for none."""
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


def _each(v: dict[str, Any], key: str) -> str:
    """What goes beside a figure in all, e.g. "6.2 a thread, "; nothing for a result saved without it."""
    each = v.get(f"{key}_per_thread")
    return "" if each is None else f"{each} a thread, "


def format_runs(results: list[dict[str, Any]]) -> str:
    """One result's table, or for several thread counts (`--threads 1,2,4`) a section each, headed by its count."""
    if len(results) == 1:
        return format_table(results[0])
    sections = []
    for r in results:
        n = r["machine"]["threads"]
        sections.append(f"== {n} thread{'s' * (n != 1)} ==\n{format_table(r)}")
    return "\n\n".join(sections)


def format_table(r: dict[str, Any]) -> str:
    lines = []
    m = r["machine"]
    lines.append(f"machine: {m['cpu']} ({m['arch']}, {m['cores']} cores, {m['memory_gib']} GiB), "
                 f"numpy {m['numpy']}, BLAS {m['blas'].get('name')} {m['blas'].get('version') or ''}"
                 + (f", {m['threads']} thread{'s' * (m['threads'] != 1)}" if "threads" in m else "")
                 + (f", {m['kernels']}" if "kernels" in m else "")
                 + (f", matmuls: {m['matmul_kernels']}" if "matmul_kernels" in m else ""))
    if "floors" in r:
        f = r["floors"]
        formats = ", ".join(f"{k}:{n}" for k, n in r["model"].get("weight_formats", {}).items())
        lines.append(f"model: {r['model']['path']} ({r['model']['parameters'] / 1e6:.0f}M parameters, "
                     f"{r['model']['weight_bytes'] / 2**20:.0f} MiB of weights as {formats or 'F32'})")
        lines.append(f"floors: memory bandwidth {f['memory_bandwidth_gbs']} GB/s "
                     f"(weights read in {f['weight_read_ms']} ms), peak sgemm {f['sgemm_gflops']} GFLOP/s"
                     + (f", integer peak {f['int_peak']['gops']} GOP/s ({_each(f['int_peak'], 'gops')}"
                        f"{f['int_peak']['variant']})" if "int_peak" in f else ""))
        if f.get("one_row_gbs"):
            lines.append("one row of x: " + ", ".join(
                f"{name} {v['gbs']} GB/s ({_each(v, 'gbs')}{v['of_bandwidth']} of bandwidth)"
                for name, v in f["one_row_gbs"].items()))
    if r.get("prefill"):
        lines.append("")
        lines.append(f"{'prefill':>10} {'tokens/s':>10} {'seconds':>9} {'matmul floor':>13} {'of floor':>9} "
                     f"{'of roofline':>12} {'of int peak':>12}")
        for p in r["prefill"]:
            lines.append(f"{p['prompt_tokens']:>10} {p['tokens_per_s']:>10} {p['seconds']:>9} "
                         f"{p['matmul_floor_s']:>12}s {p['fraction_of_floor']:>9} {p['fraction_of_roofline']:>12} "
                         f"{p.get('fraction_of_int_peak', '-'):>12}")
    if r.get("decode"):
        lines.append("")
        has_floor = "fraction_of_floor" in r["decode"][0]
        head = f"{'concurrency':>11} {'tokens/s':>9}"
        if has_floor:
            head += f" {'floor tok/s':>11} {'of floor':>9} {'of roofline':>12}"
        head += f" {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}"
        lines.append(head)
        for d in r["decode"]:
            row = f"{d['concurrency']:>11} {d['tokens_per_s']:>9}"
            if has_floor:
                row += f" {d['floor_tokens_per_s']:>11} {d['fraction_of_floor']:>9} {d['fraction_of_roofline']:>12}"
            row += (f" {d['ttft_ms_p50']:>7}ms {d['ttft_ms_p99']:>7}ms {d['itl_ms_p50']:>6}ms {d['itl_ms_p99']:>6}ms")
            lines.append(row)
    if "peak_rss_mib" in r:
        lines.append("")
        lines.append(f"peak resident memory: {r['peak_rss_mib']} MiB")
    return "\n".join(lines)
