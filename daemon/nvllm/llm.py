"""LLM: the offline Python API, in vLLM's shape.

    from nvllm import LLM, SamplingParams
    llm = LLM(model="models/smollm2-135m-instruct")
    print(llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0))[0].text)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nvllm.engine.llm_engine import EngineConfig, LLMEngine
from nvllm.engine.sequence import RequestOutput, TokenLogprob
from nvllm.model.kv_cache import KVCache
from nvllm.model.loader import load_config
from nvllm.sampling_params import SamplingParams

Prompt = str | dict[str, Any]      # text, {"prompt_token_ids": [...]} or {"messages": [...]}


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
    error: str | None = None

    def update(self, out: RequestOutput) -> None:
        self.text += out.text
        self.token_ids += out.token_ids
        if out.logprobs is not None:
            self.logprobs = (self.logprobs or []) + out.logprobs
        self.finish_reason, self.stop_reason, self.error = out.finish_reason, out.stop_reason, out.error
        self.prompt_tokens, self.completion_tokens = out.prompt_tokens, out.completion_tokens
        self.cached_tokens = out.cached_tokens


def default_num_blocks(model_dir: Path, block_size: int, max_num_seqs: int, max_model_len: int,
                       memory_fraction: float = 0.25) -> int:
    """Enough pages for every seat at full length, but no more than a share of available memory."""
    c = load_config(model_dir)
    per_block = KVCache.bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim)
    want = max_num_seqs * -(-max_model_len // block_size)
    can = int(psutil.virtual_memory().available * memory_fraction) // per_block
    return max(1, min(want, can))


class LLM:
    def __init__(self, model: str | Path, block_size: int = 16, num_blocks: int | None = None,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 512,
                 max_model_len: int | None = None, enable_prefix_caching: bool = True,
                 blas_threads: int = 0) -> None:
        model_dir = Path(model)
        cfg = load_config(model_dir)
        max_len = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if num_blocks is None:
            num_blocks = default_num_blocks(model_dir, block_size, max_num_seqs, max_len)
        self._attach(LLMEngine.from_dir(model_dir, EngineConfig(
            block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_len,
            enable_prefix_caching=enable_prefix_caching, blas_threads=blas_threads)))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._ids = itertools.count()

    def _prompt_ids(self, prompt: Prompt) -> str | list[int]:
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"])
            if "messages" in prompt:
                return self.tokenizer.encode_chat(prompt["messages"])
            if "prompt" in prompt:
                return prompt["prompt"]
        raise TypeError(f"a prompt is a string, {{'prompt_token_ids': [...]}} or {{'messages': [...]}}, got {prompt!r}")

    def stream(self, prompts: Prompt | Sequence[Prompt],
               params: SamplingParams | Sequence[SamplingParams] | None = None
               ) -> Iterator[tuple[int, RequestOutput]]:
        """All prompts through one engine, batched; yields (prompt index, delta) as they come."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        index: dict[str, int] = {}
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                rid = f"offline-{next(self._ids)}"
                self.engine.add_request(rid, self._prompt_ids(prompt), p)
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
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """One result per prompt, in order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        results: list[CompletionOutput | None] = [None] * len(prompts)
        for i, out in self.stream(prompts, params):
            if results[i] is None:
                results[i] = CompletionOutput(out.request_id)
            results[i].update(out)
        return [r for r in results if r is not None]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """One conversation (a list of messages) or several; the chat template adds the assistant turn."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([{"messages": m} for m in convs], params)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
