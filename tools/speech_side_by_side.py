"""nvllm's speech-to-text beside faster-whisper (int8 and float32) and whisper.cpp: the same clips, the same
weights, the same thread counts, model loading left out, greedy decoding (beam 1) and no timestamps everywhere.

    tools/speech_peers_setup.sh PEERS WHISPER_CPP_SRC CT2_FOLDER      # once: builds and installs the peers
    .venv/bin/python tools/speech_side_by_side.py --model CT2_FOLDER --peers PEERS \\
        [--clips 'tests/data/speech/*.wav'] [--threads 1,2] [--rounds 3] [--passes 3] [--batch 16] [--json]

Each tool runs in a process of its own, loads the model (not timed), transcribes the clip once to warm up,
then `passes` times; its figure is the mean pass:
- nvllm: `nvllm bench --transcribe CLIP --clips 1 --repeats P --threads T --json` (the engine's whole path:
  the file's bytes decoded, log-mel, encoder, decoder steps);
- faster-whisper: tools/speech_fw_timing.py by the peers' venv (WhisperModel(compute_type=int8 or float32,
  cpu_threads=T).transcribe(path, beam_size=1, best_of=1, without_timestamps=True));
- whisper.cpp: whisper-cli -t T -bs 1 -bo 1 -nt on the ggml f16 file of the same weights; its own timings
  (total less load) of a run over the clip once and a run over it 1 + P times, the difference over P: the
  passes after its first, as the others time theirs.
Rounds alternate the tools (each round starts with the next one), so a busy neighbour slows them all; the table
gives each tool's median over the rounds and the ratios (the peer's seconds / nvllm's, per round, median:
above 1 nvllm is faster). With --batch N, the first clip (the longest by default: --batch-clip) is also
transcribed as N copies at once, nvllm (all added, then stepped: the decoder steps batched) against
faster-whisper's BatchedInferencePipeline (batch_size N, one clip_timestamps region a copy), in audio seconds
per wall second, one pass a round after a warm-up.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FW_SCRIPT = ROOT / "tools" / "speech_fw_timing.py"
TOOLS = ("nvllm", "fw-int8", "fw-f32", "whisper.cpp")
_LOAD = re.compile(r"load time =\s*([\d.]+) ms")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ...: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def nvllm(model: str, clip: str, threads: int, passes: int, copies: int = 1) -> tuple[float, float, str]:
    """(seconds of a pass, audio seconds transcribed in it, text) by `nvllm bench --transcribe`."""
    r = _run([sys.executable, "-m", "nvllm.cli", "bench", "--transcribe", clip, "--model", model, "--threads",
              str(threads), "--clips", str(copies), "--repeats", str(passes), "--json"])
    out = json.loads(r.stdout)
    row = out["runs"][0]
    return statistics.mean(row["runs_s"]), row["audio_s"], out["text"]


def faster_whisper(python: str, model: str, clip: str, threads: int, passes: int, compute: str,
                   copies: int = 1) -> tuple[float, float, str]:
    r = _run([python, str(FW_SCRIPT), model, clip, "--compute-type", compute, "--threads", str(threads),
              "--passes", str(passes), "--copies", str(copies)], {"OMP_NUM_THREADS": str(threads)})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return statistics.mean(out["passes_s"]), out["audio_s"], out["text"]


def _cli_seconds(cli: str, ggml: str, clip: str, threads: int, times: int) -> tuple[float, str]:
    """whisper-cli's own time over the clip `times` times, its load left out; and its text."""
    cmd = [cli, "-m", ggml, "-t", str(threads), "-bs", "1", "-bo", "1", "-nt"]
    for _ in range(times):
        cmd += ["-f", clip]
    r = _run(cmd)
    load, total = _LOAD.search(r.stderr), _TOTAL.search(r.stderr)
    if load is None or total is None:
        raise RuntimeError(f"whisper-cli printed no timings:\n{r.stderr[-2000:]}")
    text = " ".join(line.strip() for line in r.stdout.splitlines() if line.strip())
    return (float(total.group(1)) - float(load.group(1))) / 1e3, text


def whisper_cpp(cli: str, ggml: str, clip: str, threads: int, passes: int) -> tuple[float, float, str]:
    once, text = _cli_seconds(cli, ggml, clip, threads, 1)
    more, _ = _cli_seconds(cli, ggml, clip, threads, 1 + passes)
    return (more - once) / passes, float("nan"), text


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and ranges over the rounds of each tool's seconds, and of each peer's ratio to nvllm."""
    out: dict[str, Any] = {}
    for tool in rows[0]["seconds"]:
        values = [r["seconds"][tool] for r in rows]
        out[tool] = {"median_s": round(statistics.median(values), 4), "min_s": round(min(values), 4),
                     "max_s": round(max(values), 4)}
        if tool != "nvllm":
            ratios = [r["seconds"][tool] / r["seconds"]["nvllm"] for r in rows]
            out[tool].update({"ratio": round(statistics.median(ratios), 2), "ratio_min": round(min(ratios), 2),
                              "ratio_max": round(max(ratios), 2)})
    return out


def compare_clip(a: argparse.Namespace, clip: str, threads: int) -> dict[str, Any]:
    """Every tool on one clip at one thread count, `rounds` rounds, alternating."""
    runners = {
        "nvllm": lambda: nvllm(a.model, clip, threads, a.passes),
        "fw-int8": lambda: faster_whisper(a.fw_python, a.model, clip, threads, a.passes, "int8"),
        "fw-f32": lambda: faster_whisper(a.fw_python, a.model, clip, threads, a.passes, "float32"),
        "whisper.cpp": lambda: whisper_cpp(a.whisper_cli, a.ggml, clip, threads, a.passes)}
    rows: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    audio = 0.0
    for r in range(a.rounds):
        order = TOOLS[r % len(TOOLS):] + TOOLS[:r % len(TOOLS)]
        seconds = {}
        for tool in order:
            print(f"  {Path(clip).name}, {threads} thread(s), round {r + 1}: {tool}", file=sys.stderr, flush=True)
            s, heard_s, text = runners[tool]()
            seconds[tool] = s
            texts.setdefault(tool, text)
            if tool == "nvllm":
                audio = heard_s
        rows.append({"seconds": seconds})
    return {"clip": clip, "audio_s": round(audio, 3), "threads": threads, "texts": texts, "rounds": rows,
            "summary": _summary(rows)}


def compare_batch(a: argparse.Namespace, clip: str, threads: int) -> dict[str, Any]:
    """N copies of the clip at once: nvllm against faster-whisper's batched pipeline, in audio seconds/second."""
    runners = {
        "nvllm": lambda: nvllm(a.model, clip, threads, 1, a.batch),
        "fw-int8": lambda: faster_whisper(a.fw_python, a.model, clip, threads, 1, "int8", a.batch),
        "fw-f32": lambda: faster_whisper(a.fw_python, a.model, clip, threads, 1, "float32", a.batch)}
    names = tuple(runners)
    rows, audio = [], 0.0
    for r in range(a.rounds):
        seconds = {}
        for tool in names[r % len(names):] + names[:r % len(names)]:
            print(f"  {a.batch} x {Path(clip).name}, {threads} thread(s), round {r + 1}: {tool}", file=sys.stderr,
                  flush=True)
            seconds[tool], heard_s, _ = runners[tool]()
            if tool == "nvllm":
                audio = heard_s
        rows.append({"seconds": seconds})
    summary = _summary(rows)
    for v in summary.values():
        v["audio_s_per_s"] = round(audio / v["median_s"], 1)
    return {"clip": clip, "copies": a.batch, "audio_s": round(audio, 3), "threads": threads, "rounds": rows,
            "summary": summary}


def table(result: dict[str, Any]) -> str:
    lines = ["| clip | audio | threads | nvllm | faster-whisper int8 | faster-whisper f32 | whisper.cpp f16 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in result["clips"]:
        s = c["summary"]
        cells = [f"{s['nvllm']['median_s']:.3f} s"] + [
            f"{s[t]['median_s']:.3f} s ({s[t]['ratio']:.2f}x)" for t in TOOLS[1:]]
        lines.append(f"| {Path(c['clip']).name} | {c['audio_s']:.1f} s | {c['threads']} | " + " | ".join(cells) + " |")
    if result["batch"]:
        lines += ["", "| copies at once | audio | threads | nvllm | faster-whisper int8 (batched) | "
                      "faster-whisper f32 (batched) |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for b in result["batch"]:
            s = b["summary"]
            cells = [f"{s['nvllm']['audio_s_per_s']} audio-s/s"] + [
                f"{s[t]['audio_s_per_s']} audio-s/s ({s[t]['ratio']:.2f}x)" for t in ("fw-int8", "fw-f32")]
            lines.append(f"| {b['copies']} x {Path(b['clip']).name} | {b['audio_s']:.0f} s | {b['threads']} | "
                         + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(medians over the rounds; in brackets the peer's time over nvllm's, per round, median: above 1 "
                 "nvllm is faster)")
    for c in result["clips"]:
        if c["threads"] == result["clips"][0]["threads"]:
            heard = {t: c["texts"].get(t, "") for t in TOOLS}
            same = len({_words(v) for v in heard.values()}) == 1
            lines.append(f"{Path(c['clip']).name}: " + (f"all heard {heard['nvllm']!r}" if same else
                         "; ".join(f"{t} {v!r}" for t, v in heard.items())))
    return "\n".join(lines)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the CTranslate2 Whisper folder (nvllm and faster-whisper read it)")
    ap.add_argument("--peers", required=True, help="the folder tools/speech_peers_setup.sh filled")
    ap.add_argument("--ggml", default=None, help="whisper.cpp's file of the same weights (default PEERS/ggml-*.bin)")
    ap.add_argument("--clips", default="tests/data/speech/*.wav", help="a glob of audio files")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="copies at once (0: none)")
    ap.add_argument("--batch-clip", default=None, help="the clip copied (default: the longest of --clips)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    peers = Path(a.peers)
    a.fw_python = str(peers / "fwvenv" / "bin" / "python")
    a.whisper_cli = str(peers / "whisper.cpp-build" / "bin" / "whisper-cli")
    a.ggml = a.ggml or next(iter(sorted(glob.glob(str(peers / "ggml-*.bin")))), "")
    clips = sorted(glob.glob(a.clips))
    missing = [p for p in (a.fw_python, a.whisper_cli, a.ggml) if not p or not Path(p).exists()]
    if missing or not clips:
        print(f"speech_side_by_side: missing {', '.join(missing) or 'clips: ' + a.clips} (run "
              f"tools/speech_peers_setup.sh first)", file=sys.stderr)
        return 2
    counts = [int(x) for x in a.threads.split(",")]
    result: dict[str, Any] = {"clips": [], "batch": []}
    for t in counts:
        for clip in clips:
            result["clips"].append(compare_clip(a, clip, t))
    if a.batch > 1:
        batch_clip = a.batch_clip or max(result["clips"], key=lambda c: c["audio_s"])["clip"]
        for t in counts:
            result["batch"].append(compare_batch(a, batch_clip, t))
    print(json.dumps(result) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
