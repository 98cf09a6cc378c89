"""The drone's spoken question, end to end (`nvllm bench --voice-query FILE --chat-model PATH`): a daemon
started as `nvllm serve` would be, serving the speech model and the chat model, asked one streamed HTTP chat
completion whose user message is the audio file as an `input_audio` part, as the drone's application would.

The time is split four ways, each a mean over the timed questions (one question first warms both models):
- upload: the request sent (the client's clock: from opening the request until its last byte is written);
- transcription: the speech model's requests, from the daemon taking the chat to the transcript (the daemon's
  /metrics: the speech model's e2e latency, which starts at the chat's arrival);
- first token: from the transcript to the answer's first token (the chat model's time to first token less the
  transcription, both from that same arrival; the engine's queue and prefill beside it);
- the rest: the answer's other tokens, to the stream's end (the client's clock).
The client's own figure, the answer's first token after the upload ends, is the one the drone waits for.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

SYSTEM = "You are the voice of a small drone. Answer the operator's question in one short sentence."
ANSWER_TOKENS = 20
READY_TIMEOUT_S = 300.0
# the daemon's histograms this bench reads, by part (server/metrics.py names them as vLLM does)
PARTS = {"e2e": "vllm:e2e_request_latency_seconds", "ttft": "vllm:time_to_first_token_seconds",
         "queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds"}


class VoiceQueryError(Exception):
    """The daemon would not start, or refused or failed a question; the message says which and why."""


def model_name(path: Path) -> str:
    """The name `nvllm serve --model PATH` serves a model by: a GGUF file's stem, a folder's own name."""
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def histograms(text: str, model: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each PARTS histogram of `model` in a Prometheus text exposition (0 where absent)."""
    out = {}
    for part, name in PARTS.items():
        got = {}
        for kind in ("sum", "count"):
            m = re.search(rf'^{re.escape(name)}_{kind}{{[^}}]*model_name="{re.escape(model)}"[^}}]*}} (\S+)$', text,
                          re.MULTILINE)
            got[kind] = float(m.group(1)) if m else 0.0
        out[part] = (got["sum"], got["count"])
    return out


class Daemon:
    """`nvllm serve` in a subprocess on loopback ports the kernel picks; its HTTP API's URL is `url`."""

    def __init__(self, models: list[Path], threads: int) -> None:
        cmd = [sys.executable, "-m", "nvllm.cli", "serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
        for m in models:
            cmd += ["--model", str(m)]
        if threads:
            cmd += ["--threads", str(threads)]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._url: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) or not self._url:
            self.stop()
            raise VoiceQueryError("the daemon did not start:\n" + "\n".join(self.lines[-30:]))
        self.url = self._url[0]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "nvllm HTTP API on " in line:
                self._url.append(line.rsplit(" on ", 1)[1].strip())
                self._ready.set()
        self._ready.set()    # it ended

    def metrics(self, model: str) -> dict[str, tuple[float, float]]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return histograms(resp.read().decode(errors="replace"), model)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ask(url: str, chat_model: str, audio: bytes, fmt: str) -> dict[str, Any]:
    """One streamed chat with the audio as the user's message: the client's times (seconds from the request's
    start), what was heard and the answer."""
    body = json.dumps({
        "model": chat_model, "stream": True, "temperature": 0, "max_tokens": ANSWER_TOKENS,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": [{"type": "input_audio", "input_audio": {
                         "data": base64.b64encode(audio).decode(), "format": fmt}}]}]}).encode()
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    sent = time.perf_counter()
    resp = conn.getresponse()
    if resp.status != 200:
        raise VoiceQueryError(f"{url}: HTTP {resp.status}: {resp.read().decode(errors='replace')[:300]}")
    first = None
    heard, answer = "", []
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        chunk = json.loads(line[5:])
        if "error" in chunk:
            raise VoiceQueryError(f"{url}: {chunk['error']}")
        told = (chunk.get("nvllm") or {}).get("transcripts") or []
        heard = heard or " ".join(t.get("text", "") for t in told)
        text = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])
        if text and first is None:
            first = time.perf_counter()
        answer.append(text)
    done = time.perf_counter()
    conn.close()
    if first is None:
        raise VoiceQueryError(f"{url}: the answer had no text")
    return {"upload_s": sent - t0, "first_token_s": first - t0, "end_s": done - t0, "heard": heard.strip(),
            "answer": "".join(answer).strip()}


def _mean(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], part: str) -> float | None:
    n = after[part][1] - before[part][1]
    return (after[part][0] - before[part][0]) / n if n > 0 else None


def voice_query(clip: Path, speech_model: Path, chat_model: Path, threads: int = 0, repeats: int = 3
                ) -> dict[str, Any]:
    """Starts the daemon, asks the question once to warm up and then `repeats` times; returns the split."""
    for what, p in (("--model", speech_model), ("--chat-model", chat_model)):
        if not p.exists():
            raise VoiceQueryError(f"{what}: {p}: no such file or folder")
    audio = clip.read_bytes()
    fmt = clip.suffix.lower().lstrip(".") or "wav"
    speech, chat = model_name(speech_model), model_name(chat_model)
    daemon = Daemon([speech_model, chat_model], threads)
    try:
        ask(daemon.url, chat, audio, fmt)    # both models loaded, their first steps taken
        s0, c0 = daemon.metrics(speech), daemon.metrics(chat)
        runs = [ask(daemon.url, chat, audio, fmt) for _ in range(repeats)]
        s1, c1 = daemon.metrics(speech), daemon.metrics(chat)
    finally:
        daemon.stop()

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in runs]))
    transcription, ttft = _mean(s0, s1, "e2e"), _mean(c0, c1, "ttft")
    after_upload = [r["first_token_s"] - r["upload_s"] for r in runs]
    out: dict[str, Any] = {
        "clip": {"path": str(clip), "bytes": len(audio)}, "speech_model": speech, "chat_model": chat,
        "threads": threads, "repeats": repeats, "heard": runs[0]["heard"], "answer": runs[0]["answer"],
        "upload_ms": round(mean("upload_s") * 1e3, 1),
        "first_token_after_upload_ms": round(float(np.mean(after_upload)) * 1e3, 1),
        "first_token_after_upload_ms_min": round(min(after_upload) * 1e3, 1),
        "first_token_after_upload_ms_max": round(max(after_upload) * 1e3, 1),
        "rest_ms": round((mean("end_s") - mean("first_token_s")) * 1e3, 1),
        "total_ms": round(mean("end_s") * 1e3, 1)}
    if transcription is not None and ttft is not None:
        out["transcription_ms"] = round(transcription * 1e3, 1)
        out["first_token_ms"] = round((ttft - transcription) * 1e3, 1)
        for part in ("queue", "prefill"):
            value = _mean(c0, c1, part)
            if value is not None:
                out[f"chat_{part}_ms"] = round(value * 1e3, 1)
    return out


def format_voice_query(r: dict[str, Any]) -> str:
    lines = [f"voice query: {r['clip']['path']} heard by {r['speech_model']} as {r['heard']!r}, answered by "
             f"{r['chat_model']} ({ANSWER_TOKENS} tokens at most): {r['answer']!r}",
             f"  the answer's first token {r['first_token_after_upload_ms']:.0f} ms after the upload ended (mean of "
             f"{r['repeats']}: {r['first_token_after_upload_ms_min']:.0f}-{r['first_token_after_upload_ms_max']:.0f})"
             f", {r['threads'] or 'default'} threads"]
    split = [f"upload {r['upload_ms']:.1f}"]
    if "transcription_ms" in r:
        split += [f"transcription {r['transcription_ms']:.1f}", f"first token {r['first_token_ms']:.1f}"]
        parts = [f"{p} {r[f'chat_{p}_ms']:.1f}" for p in ("queue", "prefill") if f"chat_{p}_ms" in r]
        if parts:
            split[-1] += f" (the chat's {', '.join(parts)})"
    split.append(f"the rest {r['rest_ms']:.1f}")
    lines.append("  split (ms, mean): " + ", ".join(split) + f"; in all {r['total_ms']:.1f}")
    return "\n".join(lines)
