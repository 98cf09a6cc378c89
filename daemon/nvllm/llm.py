"""LLM: the offline Python API, in vLLM's shape.

    from nvllm import LLM, SamplingParams
    llm = LLM(model="models/smollm2-135m-instruct.gguf")
    print(llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0))[0].text)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput, TokenLogprob
from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    dropped_prompt_tokens: int = 0     # a chat's oldest turns left out (context_overflow "drop_oldest")
    error: str | None = None

    def update(self, out: RequestOutput) -> None:
        self.text += out.text
        self.token_ids += out.token_ids
        if out.logprobs is not None:
            self.logprobs = (self.logprobs or []) + out.logprobs
        self.finish_reason, self.stop_reason, self.error = out.finish_reason, out.stop_reason, out.error
        self.prompt_tokens, self.completion_tokens = out.prompt_tokens, out.completion_tokens
        self.cached_tokens, self.dropped_prompt_tokens = out.cached_tokens, out.dropped_prompt_tokens


class LLM:
    """Keyword arguments are the settings' names (deploy/nvllm.toml); what is not given takes the
    daemon's default, the page pool included (engine/assembly/factory.py sizes it by the daemon's rule)."""

    def __init__(self, model: str | Path, block_size: int | None = None, num_blocks: int | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, enable_prefix_caching: bool | None = None,
                 threads: int | None = None, quantization: str | None = None,
                 activations: str | None = None, blas_threads: int | None = None,
                 kv_cache_dtype: str | None = None, speculative_config: dict[str, Any] | None = None,
                 hybrid_kv_cache: bool | None = None) -> None:
        # blas_threads: model.threads' old name, still taken (config.py warns of it); speculative_config:
        # the [speculative] settings by name (vLLM's argument), e.g. {"method": "ngram", "num_tokens": 4}
        settings = load_settings(overrides={
            "model": {"path": str(model), "threads": threads, "blas_threads": blas_threads,
                      "quantization": quantization, "activations": activations},
            "cache": {"block_size": block_size, "num_blocks": num_blocks,
                      "enable_prefix_caching": enable_prefix_caching, "dtype": kv_cache_dtype,
                      "hybrid_kv_cache": hybrid_kv_cache},
            "scheduler": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                          "max_model_len": max_model_len},
            "speculative": dict(speculative_config or {})})
        self._attach(build_engine(settings))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._ids = itertools.count()

    def stream(self, prompts: Prompt | Sequence[Prompt],
               params: SamplingParams | Sequence[SamplingParams] | None = None,
               priority: Sequence[int] | None = None) -> Iterator[tuple[int, RequestOutput]]:
        """All prompts through one engine, batched; yields (prompt index, delta) as they come.
        `priority`: one per prompt, lower runs earlier (vLLM's rule); all 0 by default."""
        batch = _prompt_list(prompts)
        per_prompt: Sequence[SamplingParams | None] = (
            [params] * len(batch) if params is None or isinstance(params, SamplingParams) else params)
        if len(per_prompt) != len(batch):
            raise ValueError(f"{len(per_prompt)} SamplingParams for {len(batch)} prompts")
        priorities = [0] * len(batch) if priority is None else list(priority)
        if len(priorities) != len(batch):
            raise ValueError(f"{len(priorities)} priorities for {len(batch)} prompts")
        index: dict[str, int] = {}
        try:
            for i, (prompt, p, priority_i) in enumerate(zip(batch, per_prompt, priorities)):
                rid = f"offline-{next(self._ids)}"
                self.engine.add_request(rid, prompt, p, priority_i)
                index[rid] = i
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    yield index[out.request_id], out
        finally:
            for rid in index:   # a caller that stops early leaves nothing running
                self.engine.abort_request(rid)
            while self.engine.has_unfinished() and not self.engine.scheduler.has_unfinished():
                self.engine.step()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[CompletionOutput]:
        """One result per prompt, in order."""
        batch = _prompt_list(prompts)
        results: list[CompletionOutput | None] = [None] * len(batch)
        for i, out in self.stream(batch, params, priority):
            result = results[i]
            if result is None:
                result = results[i] = CompletionOutput(out.request_id)
            result.update(out)
        return [r for r in results if r is not None]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """One conversation (a list of messages) or several; the chat template adds the assistant turn."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([{"messages": m} for m in convs], params)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text or a dict) as a list of one; anything else is already a sequence of prompts."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    return list(cast(Sequence[Prompt], prompts))
