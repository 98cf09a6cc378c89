"""The engine loop in its own thread, its outputs handed to asyncio.

LLMEngine is not thread-safe, so one thread owns it: every call that touches engine state (add,
abort, step, stats) runs there. The asyncio side talks to it through an inbox (a SimpleQueue of
commands plus an Event that wakes the loop) and gets outputs back with one
`loop.call_soon_threadsafe` per step, which fans them out to one asyncio.Queue per request. A
stream costs a queue and a dict entry, never a thread.

The loop sleeps on the Event when there is nothing to run and wakes at least every `heartbeat_s`
to bump `progress`, which the systemd watchdog pinger reads: a loop stuck in a step stops the
counter, and with it the pings.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput
from nvllm.engine.prompt import Prompt, Tokenized, detokenize, tokenize
from nvllm.engine.request_stream import PendingRequest, RequestStream, Stream
from nvllm.engine.sequence import Sequence
from nvllm.engine.turns import STEPS
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.transcription_params import TranscriptionParams

log = logging.getLogger("nvllm.engine.async")


class EngineDead(RuntimeError):
    """The engine loop is not running (never started, or shut down)."""


@dataclass
class _Command:
    kind: str                    # "add", "abort", "throttle", "stop"
    arg: Any = None


def _failed_output(request_id: str, error: str | None) -> RequestOutput:
    """A final "abort" output for a request the engine did not finish (error None: shut down)."""
    return RequestOutput(request_id=request_id, text="", token_ids=[], logprobs=None, finished=True,
                         finish_reason="abort", stop_reason=None, prompt_tokens=0, completion_tokens=0,
                         cached_tokens=0, error=error)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, heartbeat_s: float = 1.0,
                 on_step: Callable[[float, int], None] | None = None) -> None:
        """on_step(seconds, tokens) runs on the engine thread after each step that ran a batch (the
        daemon's step-time metric): keep it short and thread-safe; an error in it is logged, never fatal."""
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be positive, got {heartbeat_s}")
        self.engine = engine
        self.heartbeat_s = heartbeat_s
        self.on_step = on_step
        # Bumped by the engine thread on every loop iteration (steps and idle wake-ups alike).
        self.progress = 0
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        # Loop-side state: only the event loop's thread touches these.
        self._streams: dict[str, Stream] = {}
        # Shared: the last stats snapshot and the adds not yet taken from the inbox.
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] = engine.stats()
        self._pending_adds = 0
        self._stuck = False

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the engine thread; outputs go to `loop` (the running loop by default)."""
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._loop = loop or asyncio.get_running_loop()
        self._running = True
        self._thread = threading.Thread(target=self._run, name="nvllm-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._running and self._thread is not None and self._thread.is_alive()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the thread; every request still in flight ends with finish_reason "abort".

        Call from the event loop's thread or, once the loop no longer runs, from any thread.
        Blocks while the current step finishes; `await loop.run_in_executor(None, stop_thread)`
        then `abort_leftovers()` does the same without blocking the loop.
        """
        self.stop_thread(timeout)
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            # Outputs the thread posted are queued on the loop already: fail the rest after them.
            running.call_soon(self.abort_leftovers)
        else:
            self.abort_leftovers()

    def stop_thread(self, timeout: float | None = 30.0) -> None:
        """Stop the engine thread (any thread may call this); what it held ends with "abort"."""
        if self._thread is None:
            return
        self._running = False
        self._send(_Command("stop"))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("engine thread did not stop within %s s", timeout)
            self._stuck = True   # it may still touch the engine: save_cache leaves it alone
        self._thread = None
        if self.engine.backing is not None:     # the pool's rest is of no use to an engine that stopped
            self.engine.backing.stop(timeout)

    def save_cache(self) -> None:
        """After stop_thread (the engine is no one's then): write the prefix cache to cache.persist_dir,
        when set (engine/warm/warmup.py). Blocks for the write; failures are logged, never raised."""
        if self._thread is not None:
            raise RuntimeError("save_cache runs once the engine thread has stopped")
        if self._stuck:
            log.error("prefix cache not written: the engine thread did not stop")
            return
        if self.engine.warmup is not None:
            self.engine.warmup.save()

    def abort_leftovers(self) -> None:
        """On the loop, after stop_thread: end the streams the engine never answered."""
        self._deliver([_failed_output(rid, None) for rid in list(self._streams)])

    # -- asyncio side -------------------------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        """The model's chat template source, which never changes (see LLMEngine.chat_template)."""
        return self.engine.chat_template

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def task(self) -> str:
        """What the model serves: "generate", "embed", "rerank" or "transcribe" (fixed when it is built)."""
        return self.engine.task

    @property
    def num_streams(self) -> int:
        """Requests in flight (including consumers that left and await their abort)."""
        return len(self._streams)

    def stats(self) -> dict[str, Any]:
        """The snapshot taken after the last step; never waits for the engine. `waiting` includes
        requests sent to the engine thread but not yet queued by it."""
        with self._lock:
            snap = dict(self._snapshot)
            snap["waiting"] = snap.get("waiting", 0) + self._pending_adds
        return snap

    def prepare(self, request_id: str, prompt: Prompt,
                params: SamplingParams | PoolingParams | TranscriptionParams | None = None,
                priority: int = 0) -> PendingRequest:
        """Validate, render and tokenize, compile a constraint (InvalidParameter on a bad request); safe off
        the engine thread, and meant for a pool of its own: a long prompt or a grammar takes a while."""
        return PendingRequest(self.engine.make_sequence(request_id, prompt, params, priority))

    def tokenize(self, prompt: Prompt, add_special_tokens: bool = True, add_generation_prompt: bool = True,
                 return_token_strs: bool = False) -> Tokenized:
        """A prompt's token ids as a request would get them (InvalidParameter naming the field); off the
        engine thread, like prepare."""
        e = self.engine
        return tokenize(e.tokenizer, e.model.config.vocab_size, prompt, add_special_tokens, add_generation_prompt,
                        return_token_strs)

    def detokenize(self, ids: list[Any]) -> str:
        """Token ids as text (InvalidParameter for an id outside the vocabulary); off the engine thread."""
        return detokenize(self.engine.tokenizer, self.engine.model.config.vocab_size, ids)

    def add(self, request: PendingRequest) -> RequestStream:
        """Queue the request now and return its stream of outputs (iterate it with `async for`).

        Closing the stream before its final output (leaving its `with` block, cancellation, a
        deadline) aborts the request; its pages are freed at once.
        """
        if not self.is_running:
            raise EngineDead("the engine is not running")
        seq = request._seq
        rid = seq.request_id
        if rid in self._streams:
            raise InvalidParameter("request_id", rid, "unique among the requests in flight (it is in use)")
        stream = Stream(asyncio.Queue())
        self._streams[rid] = stream
        with self._lock:
            self._pending_adds += 1
        self._send(_Command("add", seq))
        return RequestStream(self._abandon, rid, stream)

    async def generate(self, request: PendingRequest) -> AsyncIterator[RequestOutput]:
        """Queue the request and yield its outputs until the final one; stopping early aborts it."""
        with self.add(request) as stream:
            async for out in stream:
                yield out

    def set_throttle(self, on: bool, threads_fraction: float = 1.0, budget_fraction: float = 1.0) -> None:
        """The board is hot (on) or no longer: applied on the engine thread between steps
        (LLMEngine.throttle); any thread may call it."""
        self._send(_Command("throttle", (on, threads_fraction, budget_fraction)))

    def _abandon(self, rid: str, stream: Stream) -> None:
        if self._streams.get(rid) is stream:
            # Keep the id reserved until the engine's final (abort) output arrives, so that
            # output can never reach a new request reusing the id.
            stream.abandoned = True
            self._send(_Command("abort", rid))

    def _send(self, cmd: _Command) -> None:
        self._inbox.put(cmd)
        self._wake.set()

    def _deliver(self, outputs: list[RequestOutput | tuple[str, BaseException]]) -> None:
        """On the event loop: hand each output to its request's queue."""
        for item in outputs:
            if isinstance(item, tuple):
                rid, exc = item
                stream = self._streams.pop(rid, None)
                if stream is not None and not stream.abandoned:
                    stream.queue.put_nowait(exc)
                continue
            stream = self._streams.get(item.request_id)
            if stream is None:
                continue
            if item.finished:
                del self._streams[item.request_id]
            if not stream.abandoned:
                stream.queue.put_nowait(item)

    def _post(self, outputs: list) -> None:
        """From the engine thread: one wake-up of the event loop per batch of outputs."""
        if not outputs or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._deliver, outputs)
        except RuntimeError:   # the loop is closed: nobody is listening any more
            pass

    # -- engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        log.info("engine loop started (heartbeat %.2f s)", self.heartbeat_s)
        stop = False
        while not stop:
            self.progress += 1
            try:
                self._wake.clear()
                stop = self._drain_inbox()
                if stop:
                    break
                if self.engine.has_unfinished():
                    self._step()
                else:
                    self._refresh()
                    self._wake.wait(self.heartbeat_s)
            except Exception as e:  # anything step() itself does not contain: fail all, live on
                log.exception("engine loop error; failing every request in flight")
                self._fail_all(f"engine loop error: {type(e).__name__}: {e}")
                self._wake.wait(0.05)   # a persistent fault must not spin a core
        self._abort_all()
        log.info("engine loop stopped")

    def _drain_inbox(self) -> bool:
        """Run every queued command; True when told to stop."""
        adds = 0
        try:
            while True:
                try:
                    cmd = self._inbox.get_nowait()
                except queue.Empty:
                    return False
                if cmd.kind == "add":
                    adds += 1
                    self._add(cmd.arg)
                elif cmd.kind == "abort":
                    self.engine.abort_request(cmd.arg)
                elif cmd.kind == "throttle":
                    self.engine.throttle(*cmd.arg)
                elif cmd.kind == "stop":
                    return True
        finally:
            if adds:
                self._refresh(adds)

    def _add(self, seq: Sequence) -> None:
        try:
            self.engine.add_sequence(seq)
        except InvalidParameter as e:
            self._post([(seq.request_id, e)])

    def _step(self) -> None:
        timed = self.engine.num_timed_steps
        with STEPS:          # one engine of the process steps at a time (engine/turns.py)
            self.engine.use_threads()
            outputs = self.engine.step()
        self._refresh()
        # Before the outputs go out, so a client that got its tokens finds the step counted (microseconds).
        if self.on_step is not None and self.engine.num_timed_steps != timed:
            try:
                self.on_step(self.engine.last_step_s, self.engine.last_step_tokens)
            except Exception:
                log.exception("on_step callback failed")
        self._post(outputs)

    def _refresh(self, adds_taken: int = 0) -> None:
        snap = self.engine.stats()
        with self._lock:
            self._snapshot = snap
            self._pending_adds -= adds_taken

    def _fail_all(self, error: str) -> None:
        """After an unexpected error: abort what the engine holds and fail every request."""
        owned = list(self.engine.seqs)
        for rid in owned:
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
        try:
            self.engine.step()   # collects the abort outputs (nothing is left to schedule)
        except Exception:
            log.exception("collecting aborted requests failed")
        try:
            self._refresh()
        except Exception:
            log.exception("stats after a failure failed")
        self._post([_failed_output(rid, error) for rid in owned])

    def _abort_all(self) -> None:
        """On shutdown: end everything with finish_reason "abort"."""
        for rid in list(self.engine.seqs):
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
        outputs: list[RequestOutput] = []
        try:
            while self.engine.has_unfinished() and not self.engine.scheduler.has_unfinished():
                outputs += self.engine.step()
        except Exception:
            log.exception("collecting aborted requests failed")
        try:
            self._refresh()
        except Exception:
            pass
        self._post(outputs)
