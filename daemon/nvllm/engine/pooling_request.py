"""A pooling request's input checked against the model that serves it: its task (an embedding model takes
texts, a cross-encoder a query and a document), its length, its vocabulary, the dimensions it asks."""

from __future__ import annotations

from nvllm.engine.prompt import Prompt, pooling_ids, prompt_ids, too_long
from nvllm.model.decoder import Model
from nvllm.model.encoder import Encoder
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter
from nvllm.text.tokenizer import Tokenizer

_WHAT = {"generate": "generates text", "embed": "gives embeddings", "rerank": "scores documents for a query",
         "transcribe": "transcribes speech"}
_ASKS = {"generate": "text", "embed": "embeddings", "rerank": "scores", "transcribe": "a transcript of audio"}


def wrong_task(asked: str, task: str) -> InvalidParameter:
    """A request for `asked` ("generate", "embed", "rerank", "transcribe") to a model whose task is `task`."""
    return InvalidParameter("model", task, f"a model that {_WHAT[asked]}",
                            message=f"model: this model {_WHAT[task]}; it cannot serve a request that asks for "
                                    f"{_ASKS[asked]}")


# Qwen3-Reranker's prompt (its model card's): the answer's first token, "yes" or "no", is the judgement.
JUDGE_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_JUDGE_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                 "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
_JUDGE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def judge_prompt(query: str, document: str, instruction: str = JUDGE_INSTRUCTION) -> str:
    return f"{_JUDGE_PREFIX}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{_JUDGE_SUFFIX}"


def pooling_input(model: Model | Encoder, tokenizer: Tokenizer, task: str, prompt: Prompt, pooling: PoolingParams,
                  max_tokens: int) -> tuple[list[int], list[int] | None]:
    """(token ids, token type ids or None) of a pooling request, or InvalidParameter naming the field."""
    pair = isinstance(prompt, dict) and set(prompt) == {"query", "document"}
    if task != ("rerank" if pair else "embed"):
        raise wrong_task("rerank" if pair else "embed", task)
    vocab = model.config.vocab_size
    if pair and isinstance(model, Model):   # a Qwen3-Reranker judges the pair in its own prompt, never cut
        assert isinstance(prompt, dict)
        for name in ("query", "document"):
            if not isinstance(prompt[name], str):
                raise InvalidParameter(name, prompt[name], "a string")
        field, ids = prompt_ids(tokenizer, vocab, judge_prompt(prompt["query"], prompt["document"]))
        types = None
        if len(ids) > max_tokens:   # the pair is what the client sent
            raise too_long("document", len(ids), max_tokens, cuttable=False)
    else:
        field, ids, types = pooling_ids(tokenizer, vocab, prompt, max_tokens, pooling.truncate_prompt_tokens)
    if field != "prompt_token_ids" and max(ids) >= vocab:
        raise InvalidParameter(field, f"token id {max(ids)}", f"text whose tokens the model has (this tokenizer "
                               f"gave an id past its {vocab}-token vocabulary)")
    if pooling.dimensions is not None:
        why = "given only by embedding models" if task != "embed" or model.pooling is None else \
            model.pooling.check_dimensions(pooling.dimensions, model.config.hidden_size)
        if why:
            raise InvalidParameter("dimensions", pooling.dimensions, why)
    return ids, types
