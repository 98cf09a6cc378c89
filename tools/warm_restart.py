"""The drone's first query after a restart, with its system prompt pinned and the prefix cache persisted.

Starts `nvllm serve` (as an operator runs it) with cache.pinned_prompts naming a ~180-token system prompt
({"messages": [system]}) and cache.persist_dir in a temporary directory, asks one question, drains it
(SIGTERM), starts it again and asks the first question of the new process, on the HTTP API
(usage.prompt_tokens_details.cached_tokens) and on the gRPC API (Usage.cached_tokens). Prints both
figures, the answer's tokens against the cold run's (greedy: equal), and how long after readiness the
warm-up (the file read back, the prompt held) was over; the query waits for that line, since readiness
does not wait for it (a query before it would simply miss the cache).

    python tools/warm_restart.py                      # the default model's GGUF, models/
    python tools/warm_restart.py --model models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
SYSTEM = (
    "You are the flight assistant on board a survey drone. You answer the operator's questions about the "
    "flight from the telemetry the autopilot sends you, in one or two short sentences. Give every number "
    "with its unit: metres for altitude and distance, metres per second for speed, degrees for heading, "
    "percent for the battery and minutes for the time left. Never guess a position or a reading: when the "
    "telemetry does not hold the answer, say so and name the sensor that would. Warn at once, before "
    "anything else, when the battery is below twenty percent, when the wind is above ten metres per second, "
    "or when the drone is closer than fifty metres to the edge of the geofence. Keep the mission's waypoints "
    "in order, count them from one, and say which one comes next. Do not give advice on flying manually.")
QUESTIONS = ("How much battery is left?", "Which waypoint comes next?")
MAX_TOKENS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    """`nvllm serve` in a subprocess, its output lines collected."""

    def __init__(self, model: str, config: Path) -> None:
        self.grpc, self.http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvllm.cli", "serve", "--model", model, "--config", str(config),
             "--listen", self.grpc, "--http-listen", self.http],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(f"{time.monotonic() - self.started:8.3f} {line.rstrip()}")

    def wait_line(self, text: str, timeout: float = 300) -> float:
        """Seconds since launch when a line with text was written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if text in line:
                    return float(line.split()[0])
            if self.proc.poll() is not None and not any(text in line for line in self.lines):
                break
            time.sleep(0.01)
        raise SystemExit(f"nvllm serve wrote no line with {text!r}:\n" + "\n".join(self.lines[-40:]))

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(120)


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask_http(serve: Serve, question: str) -> tuple[str, int, int]:
    """(the answer's text, prompt tokens, cached prompt tokens)."""
    body = {"messages": messages(question), "temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    req = urllib.request.Request(f"http://{serve.http}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out: dict[str, Any] = json.loads(r.read())
    usage = out["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return out["choices"][0]["message"]["content"], usage["prompt_tokens"], cached


def ask_grpc(serve: Serve, question: str) -> tuple[list[int], int, int]:
    """(the answer's token ids, prompt tokens, cached prompt tokens)."""
    chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages(question)]
    req = pb.GenerateRequest(chat=pb.ChatMessages(messages=chat))
    req.sampling_params.CopyFrom(pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    with grpc.insecure_channel(serve.grpc) as ch:
        out = list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=120))
    return [t for r in out for t in r.token_ids], out[-1].usage.prompt_tokens, out[-1].usage.cached_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct.gguf"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nvllm-warm-") as tmp:
        d = Path(tmp)
        (d / "system.json").write_text(json.dumps({"messages": [{"role": "system", "content": SYSTEM}]}))
        (d / "nvllm.toml").write_text(
            f'log_level = "info"\n[cache]\npinned_prompts = ["{d / "system.json"}"]\n'
            f'persist_dir = "{d / "store"}"\n[scheduler]\nmax_num_seqs = 4\n')
        first = Serve(args.model, d / "nvllm.toml")
        first.wait_line("nvllm serving ")
        first.wait_line("pinned prompt ")
        cold: dict[str, tuple[Any, int, int]] = {"grpc": ask_grpc(first, QUESTIONS[0]),
                                                 "http": ask_http(first, QUESTIONS[1])}
        rc = first.stop()
        written = next((line for line in first.lines if "written to" in line), "no prefix cache written")
        print(f"first start: cold queries {cold['grpc'][2]}/{cold['grpc'][1]} and {cold['http'][2]}/"
              f"{cold['http'][1]} prompt tokens cached; drained (exit {rc}): {written.split(None, 1)[-1]}")

        second = Serve(args.model, d / "nvllm.toml")
        ready = second.wait_line("nvllm serving ")
        loaded = second.wait_line("pages read back")
        held = second.wait_line("pinned prompt ")
        warm: dict[str, tuple[Any, int, int]] = {"grpc": ask_grpc(second, QUESTIONS[0]),
                                                 "http": ask_http(second, QUESTIONS[1])}
        second.stop()
        print(f"restart: ready at {ready:.2f} s; prefix cache read back {loaded - ready:+.3f} s and the prompt "
              f"held {held - ready:+.3f} s after readiness")
        for line in second.lines:
            if "pages read back" in line or "pinned prompt " in line:
                print("  " + line.split(None, 1)[-1])
        for api in ("grpc", "http"):
            answer, prompt, cached = warm[api]
            same = "the cold run's answer" if answer == cold[api][0] else "ANOTHER ANSWER THAN THE COLD RUN"
            print(f"first {api} query after the restart: {cached} of {prompt} prompt tokens cached; {same}")
        worst = min(warm["grpc"][2], warm["http"][2])
        print(f"cached prompt tokens, first query after restart: {worst} (target >= 160)")
        return 0 if worst >= 160 and all(warm[a][0] == cold[a][0] for a in warm) else 1


if __name__ == "__main__":
    sys.exit(main())
