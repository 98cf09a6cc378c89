"""step(): schedule -> run the model -> sample -> append, detokenize, check stops -> outputs."""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from nvllm.config import Settings
from nvllm.engine.block_manager import BlockManager
from nvllm.engine.outputs import RequestOutput, TokenLogprob, TopLogprob
from nvllm.engine.packing import pack
from nvllm.engine.pooling_request import pooling_input, wrong_task
from nvllm.engine.prompt import Prompt, generation_ids
from nvllm.engine.sampling_rows import Row, plain_greedy, sampling_batch
from nvllm.engine.scheduler import ScheduledBatch, Scheduler
from nvllm.engine.sequence import Sequence, check_priority
from nvllm.engine.speculation.speculator import Speculator
from nvllm.engine.stops import append_token, request_output
from nvllm.engine.structured.compiler import StructuredCompiler
from nvllm.engine.structured.thinking import prompt_ends_thinking
from nvllm.engine.transcription.request import transcription_sequence
from nvllm.engine.transcription.transcriber import Transcriber
from nvllm.engine.transcription.transcriber import output as transcription_output
from nvllm.engine.warm.warmup import Warmup
from nvllm.model.decoder import Model
from nvllm.model.encoder import Encoder
from nvllm.model.kernels import matmul, threads
from nvllm.model.kv_cache import KVCache
from nvllm.model.sampling.sampler import SamplerOutput, greedy, sample
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.text.detokenizer import IncrementalDetokenizer
from nvllm.text.tokenizer import Tokenizer
from nvllm.transcription_params import TranscriptionParams

log = logging.getLogger("nvllm.engine")


class Backing(Protocol):
    """What the step reads of the thread backing the pool after start-up (engine/assembly/pool_backing.py)."""

    @property
    def backed(self) -> int: ...      # the first pages, resident and usable

    @property
    def error(self) -> str | None: ...  # why the backing stopped short, once it has

    def stop(self, timeout: float | None = 30.0) -> None: ...  # no more backing: the engine stops


class LLMEngine:
    """Built by engine/assembly/factory.py, which loads the model, merges the EOS ids and sizes the pool."""

    def __init__(self, model: Model | Encoder | Any, tokenizer: Tokenizer, kv_cache: KVCache, settings: Settings,
                 max_model_len: int, speculator: Speculator, structured: StructuredCompiler,
                 generation_defaults: Mapping[str, Any] | None = None, eos_token_ids: Iterable[int] = (),
                 backing: Backing | None = None, think_tokens: tuple[int, int] | None = None) -> None:
        """The concerns come built (engine/assembly/factory.py): speculation (speculator), structured output
        (structured, and think_tokens where a grammar waits for the end of the thinking), the pool's
        backing; the warm cache (`warmup`) is attached once the engine exists, since it feeds it requests."""
        self.model = model
        # "generate", or "embed" / "rerank": a pooling model, whose requests are each computed whole in one
        # step and answered with a vector (PoolingParams), never sampled.
        self.task = model.task
        self.tokenizer = tokenizer
        self.kv_cache = kv_cache
        self.settings = settings
        self.max_model_len = max_model_len
        self.threads = threads.configure(settings.model.threads)   # BLAS's and the in-place kernels'
        self.step_threads = self.threads    # what its steps run with: fewer while the board is hot
        matmul.pin_threads(settings.model.pin_threads)
        self.activations = matmul.set_activations(settings.model.activations)   # the kernels' variant
        self.backing = backing   # the thread backing the rest of kv_cache's blocks (None: all are resident)
        bm = BlockManager(kv_cache.num_blocks, kv_cache.block_size, settings.cache.enable_prefix_caching,
                          None if backing is None else backing.backed, kv_cache.layout.windows)
        self.block_manager = bm
        self.speculator = speculator
        self.scheduler = Scheduler(self.block_manager, settings.scheduler.max_num_seqs,
                                   settings.scheduler.max_num_batched_tokens,
                                   settings.scheduler.priority_aging_steps, self.speculator.release)
        self.generation_defaults = dict(generation_defaults or {})
        self.eos_token_ids = frozenset(eos_token_ids)
        self.seqs: dict[str, Sequence] = {}      # every unfinished request, by id
        self._aborted: list[RequestOutput] = []
        self.num_steps = 0
        self.num_prompt_tokens_computed = 0
        self.num_generated_tokens = 0
        # Wall time of the steps that ran a batch (failed ones too), for the daemon's step-time metric.
        self.num_timed_steps = 0
        self.step_seconds_total = 0.0
        self.last_step_s = 0.0
        self.last_step_tokens = 0
        self._recent: deque[tuple[float, int]] = deque()   # (time, tokens generated) for tokens/s
        # Structured output: compiles constraints (on the threads that tokenize requests) and fills each
        # step's bitmask.
        self.structured = structured
        # Fill the bitmask on a thread of its own while the model runs (llguidance and BLAS both let go
        # of the GIL); False fills it after the forward pass, on the engine thread.
        self.structured_overlap = True
        # (start, end) thinking tokens: a grammar then waits for the end of the thinking (structured/thinking.py).
        self.think_tokens = think_tokens
        self._mask_filler: ThreadPoolExecutor | None = None
        # Pinned prompts and the persisted prefix cache (engine/warm/warmup.py), set by the factory when asked.
        self.warmup: Warmup | None = None
        # A speech model's step (engine/transcription/): its windows' encoder, decoder and Whisper's rules.
        self.transcriber = Transcriber(model, self.scheduler) if self.task == "transcribe" else None
        self.whisper_tokens = Transcriber.tokens_of(model, tokenizer) if self.transcriber is not None else None

    @property
    def chat_template(self) -> str | None:
        """The model's chat template source (None without one): the server reads a model's tool-call
        format from it as plain text, never touching the tokenizer."""
        return self.tokenizer.chat_template

    def throttle(self, on: bool, threads_fraction: float = 1.0, budget_fraction: float = 1.0) -> None:
        """The board is hot (on) or no longer: fewer matmul threads and a smaller step budget, or both back. A
        pooling model keeps its budget: it admits a request only whole, in one step."""
        self.step_threads = max(1, int(self.threads * threads_fraction)) if on else self.threads
        n = threads.configure(self.step_threads)
        full, page = self.scheduler.max_num_batched_tokens, self.kv_cache.block_size
        low = max(min(page, full), int(full * budget_fraction)) if on and self.task == "generate" else None
        self.scheduler.throttled_budget = low
        log.info("heat: %d of %d matmul threads, a step's token budget %d of %d", n, self.threads, low or full, full)

    def use_threads(self) -> None:
        """Before a step: the process's kernel threads set to this engine's (several models' engines share
        one count, each with its own model.threads)."""
        if threads.count != self.step_threads:
            threads.configure(self.step_threads)

    # -- requests -----------------------------------------------------------------------------
    def make_params(self, params: SamplingParams | None) -> SamplingParams:
        """The request's parameters with the model's defaults filled in, validated once."""
        limits = self.settings.server
        return (params or SamplingParams()).resolve(
            self.generation_defaults, max_stop_strings=limits.max_stop_strings, vocab_size=self.model.config.vocab_size,
            max_stop_string_chars=limits.max_stop_string_chars, max_model_len=self.max_model_len)

    def add_request(self, request_id: str, prompt: Prompt,
                    params: SamplingParams | PoolingParams | TranscriptionParams | None = None,
                    priority: int = 0) -> None:
        """Queue a request; refuses (InvalidParameter) one that is malformed or can never fit. Lower
        priority runs earlier (vLLM's rule)."""
        self.add_sequence(self.make_sequence(request_id, prompt, params, priority))

    def add_sequence(self, seq: Sequence) -> None:
        if seq.request_id in self.seqs:
            raise InvalidParameter("request_id", seq.request_id,
                                   "unique among the requests in flight (it is already in use)")
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def make_sequence(self, request_id: str, prompt: Prompt,
                      params: SamplingParams | PoolingParams | TranscriptionParams | None = None,
                      priority: int = 0) -> Sequence:
        """Validate a request, render and tokenize its prompt, and build its sequence. Reads no engine
        state that steps change, so another thread may call it while the engine runs. PoolingParams (or
        none, for a pooling model) make a pooling request, TranscriptionParams a transcription (its prompt
        {"audio": bytes}, decoded here)."""
        priority = check_priority(priority)
        if isinstance(params, TranscriptionParams) or (params is None and self.task == "transcribe"):
            if self.whisper_tokens is None or self.transcriber is None:
                raise wrong_task("transcribe", self.task)
            seed = params.seed if params is not None and params.seed is not None else secrets.randbits(63)
            return transcription_sequence(request_id, prompt, params or TranscriptionParams(), self.tokenizer,
                                          self.whisper_tokens, self.transcriber.num_mel_bins,
                                          self.settings.server.max_audio_seconds, seed, priority)
        if isinstance(params, PoolingParams) or (params is None and self.task != "generate"):
            return self._pooling_sequence(request_id, prompt, params or PoolingParams(), priority)
        if self.task != "generate":
            raise wrong_task("generate", self.task)
        params = self.make_params(params)
        ids, dropped = generation_ids(self.tokenizer, self.model.config.vocab_size, prompt, params, self.max_model_len)
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        detok = IncrementalDetokenizer(self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens)
        seq = Sequence(request_id, ids, params, detok, self.eos_token_ids, seed, priority)
        seq.dropped_prompt_tokens = dropped
        if params.structured is not None:   # compiled here, off the engine thread, in bounded time
            matcher = self.structured.matcher(params.structured)
            if self.think_tokens is not None and not prompt_ends_thinking(ids, self.think_tokens):
                seq.structured_after_thinking = (self.think_tokens[1], matcher)
            else:
                seq.structured = matcher
        return seq

    def _pooling_sequence(self, request_id: str, prompt: Prompt, pooling: PoolingParams, priority: int) -> Sequence:
        ids, types = pooling_input(self.model, self.tokenizer, self.task, prompt, pooling, self.max_model_len)
        seq = Sequence(request_id, ids, self.make_params(SamplingParams(max_tokens=1)),
                       IncrementalDetokenizer(self.tokenizer, ids), frozenset(), 0, priority)
        seq.pooling, seq.token_types = pooling, types
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its pages; its final output comes with the next step()."""
        seq = self.seqs.pop(request_id, None)
        if seq is None or seq.is_finished:
            return False
        self.scheduler.finish(seq)
        seq.finish_reason = "abort"
        self._aborted.append(request_output(seq))
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted) or \
            (self.warmup is not None and self.warmup.busy)

    # -- the step -----------------------------------------------------------------------------
    def _take_backed(self) -> None:
        """Hand the pages backed since the last step to the block manager; none other is ever used."""
        if self.backing is not None:
            self.block_manager.add_backed(self.backing.backed)

    def step(self) -> list[RequestOutput]:
        self._take_backed()
        if self.warmup is None:
            return self._schedule_and_run()
        self.warmup.advance()   # a share of the start-up work; the pinned prompts' outputs are its own
        return self.warmup.own(self._schedule_and_run())

    def _schedule_and_run(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        t0 = time.perf_counter()
        self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if not batch:
            return outputs
        # A step of decode rows only prices its row count for the speculator (prefill chunks do not).
        decode_only = all(n == 1 + len(s.draft_tokens) for s, n in zip(batch.seqs, batch.num_new_tokens))
        try:
            return self._step(batch, outputs)
        finally:
            self.last_step_s = time.perf_counter() - t0
            if decode_only:
                self.speculator.observe(batch.num_tokens, self.last_step_s)
            self.last_step_tokens = batch.num_tokens
            self.step_seconds_total += self.last_step_s
            self.num_timed_steps += 1

    def _step(self, batch: ScheduledBatch, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Run a scheduled batch and append its outputs to `outputs` (those of aborts so far)."""
        try:
            sampled, result = self._run(batch)
        except Exception as e:  # one bad step fails only its own requests
            log.exception("engine step failed; failing its %d requests", len(batch.seqs))
            for seq in batch.seqs:
                # Logged per request, so that the request's own lines tell it failed and why.
                log.error("failed in engine step %d: %s: %s", self.num_steps, type(e).__name__, e,
                          extra={"request_id": seq.request_id})
                self._finish(seq, "abort")
                out = request_output(seq)
                out.error = f"{type(e).__name__}: {e}"
                outputs.append(out)
            return outputs
        self.num_steps += 1
        now = time.monotonic()
        pooled = [seq for seq in batch.seqs if seq.pooled is not None]
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.draft_tokens:
                continue   # what it computed depends on what verification accepts: _accept
            before = seq.num_computed_tokens
            seq.num_computed_tokens += n
            if before < seq.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(seq.num_prompt_tokens, seq.num_computed_tokens) - before
            self.block_manager.mark_computed(seq, before)
            self.block_manager.release_behind_window(seq)
        for seq in pooled:   # computed whole this step: answered, and its pages given back
            self._finish(seq, "stop")
            outputs.append(request_output(seq))
        if self.transcriber is not None:
            return self._transcribed(sampled, outputs)
        row = generated = 0
        while row < len(sampled):
            assert result is not None     # _run samples whenever a sequence is due a token
            seq = sampled[row][0]
            drafts, before = seq.draft_tokens, seq.num_computed_tokens
            kept = 1
            if drafts:   # its cache now holds the K/V of its last token and of the proposals kept
                kept += self.speculator.accept(seq, result.token_ids[row:row + 1 + len(drafts)])
                seq.num_computed_tokens += kept
            for r in range(row, row + kept):
                self._append(seq, int(result.token_ids[r]), self._logprob(seq, result, r))
                generated += 1
                if seq.is_finished:
                    break
            if drafts and not seq.is_finished:
                self.block_manager.settle(seq, before)   # the rejected proposals' slots given back
            row += 1 + len(drafts)
            seq.draft_tokens = []
            outputs.append(request_output(seq))
        self.num_generated_tokens += generated
        self._recent.append((now, generated))
        return outputs

    def _transcribed(self, chosen: list, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """A speech model's rows: each token appended, or its window ended (the next queued, or the end)."""
        assert self.transcriber is not None
        for seq, token in chosen:
            if token is not None:
                seq.token_ids.append(token)
                self.num_generated_tokens += 1
                continue
            more, out = self.transcriber.window_ended(seq)
            if out is not None:
                outputs.append(out)
            if not more:
                self._finish(seq, "stop")
                outputs.append(transcription_output(seq, [], finished=True))
        return outputs

    def _logprob(self, seq: Sequence, result: SamplerOutput, row: int) -> TokenLogprob | None:
        if seq.params.logprobs is None:
            return None
        token = int(result.token_ids[row])
        top = result.top_logprobs[row]
        pairs = [] if top is None else [TopLogprob(int(i), float(p), *self._token_strings(int(i)))
                                        for i, p in zip(*top)]
        return TokenLogprob(token, float(result.logprobs[row]), pairs, *self._token_strings(token))

    def _token_strings(self, token_id: int) -> tuple[str, str]:
        """(vocabulary entry, text decoded alone) of a token, for logprobs."""
        return (self.tokenizer.id_to_token(token_id) or "",
                self.tokenizer.decode([token_id], skip_special_tokens=False))

    def _run(self, batch: ScheduledBatch) -> tuple[list[Row] | list[tuple[Sequence, int | None]], SamplerOutput | None]:
        """Pack the batch (packing.py), run the model, sample the rows of sequences whose last token was
        computed, each constrained row under its matcher's mask: the sampler's rows and its output. A speech
        model's rows are (sequence, its next token or None where its window ended), chosen by Whisper's rules."""
        (fb, rows), model = pack(batch, self.kv_cache.block_size, self.kv_cache.layout.num_groups), self.model
        if self.transcriber is not None:   # Whisper's rows choose their own tokens (transcription/)
            return self.transcriber.run(batch.seqs, fb, rows, self.kv_cache), None
        if self.task != "generate" or isinstance(model, Encoder):   # a pooling step: a vector per sequence
            vectors = model.pool(fb, self.kv_cache, [s.pooling.dimensions if s.pooling else None for s in batch.seqs])
            for seq, v in zip(batch.seqs, vectors):
                seq.pooled = v.tolist()
            return [], None
        constrained = [r for r, (s, _) in enumerate(rows) if s.structured is not None]
        # Each constrained sequence once, with its proposals: a mask for each of its rows.
        items = [(s.structured, s.draft_tokens) for s, ahead in rows if s.structured is not None and not ahead]
        bits: np.ndarray | None = None
        filling: Future | None = None
        if constrained and self.structured_overlap:
            if self._mask_filler is None:
                self._mask_filler = ThreadPoolExecutor(1, thread_name_prefix="nvllm-mask")
            filling = self._mask_filler.submit(self.structured.fill_ahead, items)
        try:
            logits = model.forward(fb, self.kv_cache)
        finally:
            if filling is not None:   # never leave a fill running past the step
                bits = filling.result()
        if not rows:
            return rows, None
        if constrained and bits is None:
            bits = self.structured.fill_ahead(items)
        self.speculator.before_sampling(batch.seqs)
        if not constrained and plain_greedy(rows):   # the common step: no per-row arrays to build
            return rows, greedy(logits)
        return rows, sample(logits, sampling_batch(rows, constrained, bits))

    # -- after sampling (stops.py) -------------------------------------------------------------
    def _append(self, seq: Sequence, token: int, lp: TokenLogprob | None) -> None:
        reason = append_token(seq, token, lp, self.max_model_len)
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        if reason != "abort" and not isinstance(seq.stop_reason, str):
            # Release text held back for an unfinished character; a stop string already cut the text.
            seq.detokenizer.flush()
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        self.seqs.pop(seq.request_id, None)

    # -- numbers ------------------------------------------------------------------------------
    def tokens_per_second(self, window_s: float = 10.0) -> float:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - window_s:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0][0], 1e-3)
        return sum(n for _, n in self._recent) / span

    def stats(self) -> dict[str, Any]:
        self._take_backed()
        bm = self.block_manager
        return {
            "pages_total": bm.num_blocks,
            "pages_backed": bm.num_backed_blocks,   # the first pages, usable; the rest are being backed
            "pool_backing_error": self.backing.error or "" if self.backing is not None else "",
            "block_size": bm.block_size,
            "kv_cache_dtype": self.kv_cache.format.name,
            "page_bytes": self.kv_cache.nbytes // max(1, self.kv_cache.num_blocks),
            "pages_free": len(bm.free_ids),
            "pages_cached": bm.num_cached_blocks,
            "pages_used": bm.num_used_blocks,
            "pages_pinned": 0 if self.warmup is None else len(self.warmup.pinned_pages),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "prefix_cache_hit_rate": bm.prefix_hit_rate,
            "prefix_cache_hit_tokens": bm.num_prefix_hits,
            "prefix_cache_query_tokens": bm.num_prefix_queries,
            "preemptions": self.scheduler.num_preemptions,
            "steps": self.num_steps,
            "step_seconds_total": self.step_seconds_total,
            "prompt_tokens_computed": self.num_prompt_tokens_computed,
            "generated_tokens": self.num_generated_tokens,
            "tokens_per_s": self.tokens_per_second(),
            **self.speculator.stats(),
        }
