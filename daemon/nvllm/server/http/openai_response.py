"""nvllm -> OpenAI's JSON: a request's RequestOutputs as the response object, or the stream chunks, of
/v1/chat/completions and /v1/completions (the request itself is read by openai_request.py)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from nvllm.engine.outputs import RequestOutput, TokenLogprob
from nvllm.server.chat.answer import ARGUMENTS, CALL, REASONING, TEXT, AnswerStream, Delta, read_answer
from nvllm.server.http.errors import ApiError
from nvllm.server.http.openai_request import CHAT, ParsedRequest

MIN_LOGPROB = -9999.0                  # JSON has no -inf; vLLM sends this floor too


def _lp(x: float) -> float:
    return x if math.isfinite(x) and x > MIN_LOGPROB else MIN_LOGPROB


def _token_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": _lp(logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(lps: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{**_token_entry(lp.text, lp.logprob),
                         "top_logprobs": [_token_entry(t.text, t.logprob) for t in lp.top]} for lp in lps]}


def completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """OpenAI's legacy shape; text_offset counts characters from `offset` (where the choice's text starts)."""
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.text)
    return {"tokens": [lp.text for lp in lps], "token_logprobs": [_lp(lp.logprob) for lp in lps],
            "top_logprobs": [{t.text: _lp(t.logprob) for t in lp.top} for lp in lps],
            "text_offset": offsets}


@dataclass
class Usage:
    """Counted over the choices: a prompt once (its choices share it), every choice's output."""
    prompt_tokens: dict[int, int] = field(default_factory=dict)     # prompt index -> tokens
    cached_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: int = 0
    dropped_tokens: dict[int, int] | None = None   # with context_overflow drop_oldest: a chat's turns dropped

    def add(self, prompt_index: int, out: RequestOutput) -> None:
        self.prompt_tokens[prompt_index] = out.prompt_tokens
        self.cached_tokens[prompt_index] = max(self.cached_tokens.get(prompt_index, 0), out.cached_tokens)
        self.completion_tokens += out.completion_tokens
        if self.dropped_tokens is not None:
            self.dropped_tokens[prompt_index] = out.dropped_prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        prompt = sum(self.prompt_tokens.values())
        usage = {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                 "total_tokens": prompt + self.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": sum(self.cached_tokens.values())}}
        if self.dropped_tokens is not None:   # nvllm's: the prompt tokens drop_oldest left out
            usage["dropped_prompt_tokens"] = sum(self.dropped_tokens.values())
        return usage


def _chat_delta(d: Delta) -> dict[str, Any]:
    """One piece of an answer (chat/answer.py) as OpenAI chat's delta."""
    if d.kind == TEXT:
        return {"content": d.text}
    if d.kind == CALL:
        return {"tool_calls": [{"index": d.index, "id": d.call_id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    assert d.kind == ARGUMENTS
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


class ResponseBuilder:
    """Builds one request's response object, or its stream chunks, from the engine's outputs."""

    def __init__(self, req: ParsedRequest, request_id: str, model_name: str, reasoning_parser: str = "",
                 thinks: bool = True) -> None:
        """reasoning_parser (server.reasoning_parser): chat answers' thinking goes to reasoning_content;
        thinks: whether the answers may think at all (the engine's word: Submission.thinks)."""
        self.req = req
        self.chat = req.kind == CHAT
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + request_id
        self.created = int(time.time())
        self.model = model_name
        self.usage = Usage(dropped_tokens={} if req.params.context_overflow == "drop_oldest" else None)
        n = req.num_choices
        self.texts = [""] * n
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.stop_reason: list[str | int | None] = [None] * n
        self.offsets = [0] * n           # characters sent so far per choice (completions' text_offset)
        self.started = [False] * n       # the chat role chunk sent
        # A chat's answer is read by chat/answer.py, as every front door reads it: its thinking apart with a
        # reasoning parser (reasoning_content), its tool calls with tools.
        self.reasoning_parser = reasoning_parser if self.chat else ""
        self.thinks = thinks
        plan = req.tool_plan if self.chat else None
        self.plan = plan if plan is not None and plan.style is not None else None
        self.answers = ([AnswerStream(self.plan, self.reasoning_parser, thinks, req.template_kwargs) for _ in range(n)]
                        if self.plan is not None or self.reasoning_parser else None)
        if req.echo:
            for i in range(n):
                self.offsets[i] = len(req.prompts[i // req.n])

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}

    # -- whole responses ---------------------------------------------------------------------
    def add(self, index: int, out: RequestOutput) -> None:
        self.texts[index] += out.text
        if out.logprobs:
            self.logprobs[index] += out.logprobs
        if out.finished:
            self.finish[index] = out.finish_reason
            self.stop_reason[index] = out.stop_reason
            self.usage.add(index // self.req.n, out)

    def response(self) -> dict[str, Any]:
        choices = []
        for i, text in enumerate(self.texts):
            c: dict[str, Any] = {"index": i}
            if self.chat:
                c["message"] = self._message(i, text)
                c["logprobs"] = chat_logprobs(self.logprobs[i]) if self.req.logprobs else None
            else:
                prefix = self.req.prompts[i // self.req.n] if self.req.echo else ""
                c["text"] = prefix + text
                c["logprobs"] = completion_logprobs(self.logprobs[i], 0) if self.req.logprobs else None
            c["finish_reason"] = self.finish[i]
            c["stop_reason"] = self.stop_reason[i]     # vLLM's extra: the stop string or token id that matched
            choices.append(c)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": self.usage.to_dict()}

    def _message(self, index: int, text: str) -> dict[str, Any]:
        if self.answers is None:
            return {"role": "assistant", "content": text}
        answer = read_answer(text, self.plan, self.reasoning_parser, self.thinks, self.req.template_kwargs)
        thought = {"reasoning_content": answer.reasoning or None} if self.reasoning_parser else {}
        if self.plan is None:
            # With a parser, an answer that is all thinking has no content (vLLM's null).
            return {"role": "assistant", "content": answer.text or None, **thought}
        self.finish[index] = answer.finish_reason(self.finish[index])
        return {"role": "assistant", "content": answer.text or None, **thought,
                "tool_calls": [c.to_dict() for c in answer.calls]}

    # -- stream chunks -------------------------------------------------------------------------
    def chunks(self, index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """The chunks one engine output makes (none when it adds nothing a client can see)."""
        if out.finished:
            self.usage.add(index // self.req.n, out)
        usage = {"usage": None} if self.req.include_usage else {}
        chunks = []
        if self.chat and not self.started[index]:
            self.started[index] = True
            chunks.append({**self._head(), "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}], **usage})
        text = out.text
        if self.answers is not None:
            deltas = self.answers[index].feed(text, final=out.finished)
            for d in deltas:
                if d.kind == REASONING:
                    chunks.append({**self._head(), "choices": [{"index": index, "delta": {"reasoning_content": d.text},
                                                                 "logprobs": None, "finish_reason": None}], **usage})
            if self.plan is not None:
                return chunks + self._tool_chunks(index, out, [d for d in deltas if d.kind != REASONING], usage)
            text = "".join(d.text for d in deltas if d.kind == TEXT)
        if not self.chat and self.req.echo and not self.started[index]:
            self.started[index] = True
            text = self.req.prompts[index // self.req.n] + text
        if not text and not out.logprobs and not out.finished:
            return chunks
        c: dict[str, Any] = {"index": index}
        if self.chat:
            c["delta"] = {"content": text} if text or not out.finished else {}
            c["logprobs"] = chat_logprobs(out.logprobs or []) if self.req.logprobs else None
        else:
            c["text"] = text
            c["logprobs"] = (completion_logprobs(out.logprobs or [], self.offsets[index])
                             if self.req.logprobs else None)
            self.offsets[index] += len(out.text)
        c["finish_reason"] = out.finish_reason if out.finished else None
        if out.finished:
            c["stop_reason"] = out.stop_reason
        chunks.append({**self._head(), "choices": [c], **usage})
        return chunks

    def _tool_chunks(self, index: int, out: RequestOutput, answer: list[Delta],
                     usage: dict[str, Any]) -> list[dict[str, Any]]:
        """Chat chunks of a choice with tools: content and tool-call deltas; the finish reason on a last
        chunk of its own ("tool_calls" when calls were made)."""
        assert self.answers is not None
        deltas = [_chat_delta(d) for d in answer]
        if out.finished or (not deltas and out.logprobs and self.req.logprobs):
            deltas.append({})
        lp = chat_logprobs(out.logprobs or []) if self.req.logprobs else None
        chunks = [{**self._head(), "choices": [{"index": index, "delta": d, "logprobs": lp if k == 0 else None,
                                                "finish_reason": None}], **usage}
                  for k, d in enumerate(deltas)]
        if out.finished:
            last = chunks[-1]["choices"][0]
            last["finish_reason"] = self.answers[index].finish_reason(out.finish_reason)
            last["stop_reason"] = out.stop_reason
        return chunks

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head(), "choices": [], "usage": self.usage.to_dict()}

    # -- as app.py's Answering -----------------------------------------------------------------
    def events(self, index: int, out: RequestOutput) -> list[dict[str, str]]:
        return [{"data": json.dumps(c, ensure_ascii=False)} for c in self.chunks(index, out)]

    def closing(self) -> list[dict[str, str]]:
        usage = [{"data": json.dumps(self.usage_chunk())}] if self.req.include_usage else []
        return usage + [{"data": "[DONE]"}]

    def failed(self, e: ApiError) -> dict[str, str]:
        return {"data": json.dumps(e.body())}

    def token_counts(self) -> tuple[int, int]:
        return sum(self.usage.prompt_tokens.values()), self.usage.completion_tokens
