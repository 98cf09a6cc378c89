"""`nvllm bench --transcribe FILE`: a speech model's speed on one clip, in process, model loading left out.

The clip is transcribed through the engine as the daemon transcribes it (LLMEngine.add_request's path with
TranscriptionParams, then step() until done), `repeats` times after one warm-up, the best run kept. Its time
is split three ways: the front end (the upload's bytes decoded to 16 kHz and Whisper's log-mel: make_sequence,
which the daemon runs off the engine thread), the encoder (the engine's Transcriber times each window's
encoder run), and the decoder (the rest of the steps: the decoder's forward passes, Whisper's token rules,
the scheduler). The real-time factor is given both ways: audio seconds per wall second ("x real time") and
wall seconds per audio second (RTF, Whisper's papers' figure).

With `--clips 1,16` the same clip is also transcribed as 16 copies at once: all added, then stepped, so the
scheduler batches their decoder steps (and each window's encoder runs as its sequence first comes in). Its
figure is the throughput in audio seconds per wall second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nvllm.bench.counts import resolved
from nvllm.bench.floors import machine_info
from nvllm.bench.progress import Progress
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.kernels import threads as kernel_threads
from nvllm.transcription_params import TranscriptionParams

# Whisper's defaults (greedy, the temperature fallback on), as the peers run theirs: the same work where the
# same windows fall back, which the windows and tokens counted beside each figure show.
PARAMS = TranscriptionParams()


def speech_engine(model: Path, seats: int, threads: int, quantization: str = "") -> LLMEngine:
    """An engine serving the speech model at `model` with room for `seats` transcriptions at once."""
    engine = build_engine(load_settings(overrides={
        "model": {"path": str(model), "threads": threads, "quantization": quantization},
        "scheduler": {"max_num_seqs": seats}}))
    if engine.task != "transcribe":
        raise ValueError(f"{model} is not a speech model (task {engine.task!r}): --transcribe measures Whisper")
    return engine


def transcribe_copies(engine: LLMEngine, audio: bytes, copies: int, tag: str) -> dict[str, Any]:
    """`copies` transcriptions of the clip at once: the wall time and its split, and the first one's text."""
    tr = engine.transcriber
    assert tr is not None
    encode0, windows0, steps0 = tr.encode_seconds, tr.num_windows, engine.num_steps
    t0 = time.perf_counter()
    seqs = [engine.make_sequence(f"{tag}-{i}", {"audio": audio}, PARAMS) for i in range(copies)]
    t1 = time.perf_counter()
    for seq in seqs:
        engine.add_sequence(seq)
    texts: dict[str, list[str]] = {s.request_id: [] for s in seqs}
    tokens = 0
    audio_seconds = 0.0
    while engine.has_unfinished():
        for out in engine.step():
            if out.error is not None:
                raise RuntimeError(f"the engine failed a transcription: {out.error}")
            texts[out.request_id].append(out.text)
            if out.finished:
                tokens += out.completion_tokens
                audio_seconds += out.audio_seconds or 0.0
    wall = time.perf_counter() - t0
    encoder = tr.encode_seconds - encode0
    return {"copies": copies, "wall_s": wall, "front_end_s": t1 - t0, "encoder_s": encoder,
            "decoder_s": wall - (t1 - t0) - encoder, "windows": tr.num_windows - windows0,
            "steps": engine.num_steps - steps0, "tokens": tokens, "audio_s": audio_seconds,
            "text": "".join(texts[seqs[0].request_id]).strip()}


def _figures(run: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The best run's figures, rounded, with every run's wall time beside them."""
    audio, wall = run["audio_s"], run["wall_s"]
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
    out.update({"x_real_time": round(audio / wall, 2), "rtf": round(wall / audio, 4) if audio else None,
                "audio_s_per_s": round(audio / wall, 2), "runs_s": [round(r["wall_s"], 4) for r in runs]})
    return out


def bench_transcribe(model: Path, clip: Path, threads: int | Sequence[int] = 0, clips: Sequence[int] = (1, 16),
                     repeats: int = 3, quantization: str = "", progress: Progress | None = None
                     ) -> list[dict[str, Any]]:
    """One result per thread count: the clip transcribed by 1 and more copies at once (`clips`), each the best
    of `repeats` runs after a warm-up, split into front end, encoder and decoder."""
    progress = progress or Progress(enabled=False)
    audio = clip.read_bytes()
    counts = resolved([threads] if isinstance(threads, int) else threads)
    progress("loading the speech model")
    engine = speech_engine(model, max(clips), counts[0], quantization)
    c = engine.model.config
    results = []
    for n in counts:
        kernel_threads.configure(n)
        at = f" on {n} thread{'s' * (n > 1)}"
        progress("warm-up" + at)
        transcribe_copies(engine, audio, 1, f"warm{n}")
        result: dict[str, Any] = {
            "machine": {**machine_info(), "threads": n},
            "model": {"path": str(model), "architecture": c.architecture, "parameters": c.num_params,
                      "weight_bytes": int(engine.model.weights.nbytes)},
            "clip": {"path": str(clip), "bytes": len(audio)}, "runs": []}
        for copies in clips:
            runs = []
            for r in range(repeats):
                progress(f"{copies} clip{'s' * (copies > 1)} at once, run {r + 1} of {repeats}" + at)
                runs.append(transcribe_copies(engine, audio, copies, f"t{n}-{copies}-{r}"))
            result["runs"].append(_figures(min(runs, key=lambda x: x["wall_s"]), runs))
        result["clip"]["seconds"] = round(result["runs"][0]["audio_s"] / result["runs"][0]["copies"], 3)
        result["text"] = result["runs"][0]["text"]
        results.append(result)
    progress.done()
    return results


def format_transcribe(results: list[dict[str, Any]]) -> str:
    """A table per thread count: each number of clips at once with its wall time, split and speed."""
    sections = []
    for r in results:
        m, mod, clip = r["machine"], r["model"], r["clip"]
        lines = [f"machine: {m['cpu']} ({m['arch']}, {m['cores']} cores), {m['threads']} "
                 f"thread{'s' * (m['threads'] != 1)}",
                 f"model: {mod['path']} ({mod['architecture']}, {mod['parameters'] / 1e6:.0f}M parameters, "
                 f"{mod['weight_bytes'] / 2**20:.1f} MiB of weights)",
                 f"clip: {clip['path']} ({clip['seconds']:.2f} s of audio): {r['text']!r}", "",
                 f"{'clips':>5} {'wall s':>8} {'front end':>10} {'encoder':>8} {'decoder':>8} {'windows':>8} "
                 f"{'tokens':>7} {'steps':>6} {'x real time':>12} {'RTF':>7}"]
        for x in r["runs"]:
            rtf = f"{x['rtf']:.4f}" if x["copies"] == 1 and x["rtf"] is not None else "-"
            lines.append(f"{x['copies']:>5} {x['wall_s']:>8.3f} {x['front_end_s']:>10.3f} {x['encoder_s']:>8.3f} "
                         f"{x['decoder_s']:>8.3f} {x['windows']:>8} {x['tokens']:>7} {x['steps']:>6} "
                         f"{x['x_real_time']:>12.2f} {rtf:>7}")
        lines.append("(seconds: the best run of each; x real time: audio seconds transcribed per wall second, all "
                     "clips together; RTF: wall seconds per audio second)")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)
