"""nvllm generate: prompts run offline, in this process, batched."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvllm.cli.flags import (
    add_activations_flag,
    add_kv_cache_dtype_flag,
    add_quantization_flag,
    add_sampling_flags,
    add_threads_flag,
    bound_note,
    default_bound,
    sampling_kwargs,
)
from nvllm.config import DEFAULT_MODEL_FILE

if TYPE_CHECKING:
    from nvllm.llm import LLM
    from nvllm.sampling_params import SamplingParams


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("generate", help="run prompts offline, in this process, batched")
    g.add_argument("prompt", nargs="*", help="prompt text (several run as one batch)")
    g.add_argument("--model", default=f"models/{DEFAULT_MODEL_FILE}",
                   help="a Hugging Face model folder or a .gguf file")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    g.add_argument("--prompts-file", help='JSON list of strings, {"messages": [...]} or {"prompt_token_ids": [...]}')
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--stream", action="store_true", help="print text as it is produced")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--num-blocks", type=int, default=None, help="KV pages (default: sized from memory)")
    g.add_argument("--stats", action="store_true",
                   help="print tokens/s, prefix-cache hit rate and preemptions to stderr at the end")
    add_quantization_flag(g)
    add_activations_flag(g)
    add_kv_cache_dtype_flag(g)
    add_threads_flag(g)
    add_sampling_flags(g, greedy_default=True)
    g.set_defaults(func=cmd_generate)


def _read_prompts(args: argparse.Namespace) -> list[Any]:
    prompts: list[Any] = []
    if args.prompts_file:
        items = json.loads(Path(args.prompts_file).read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise SystemExit(f"{args.prompts_file}: expected a JSON list of prompts")
        for i, item in enumerate(items):
            if isinstance(item, str):
                prompts.append([{"role": "user", "content": item}] if args.chat else item)
            elif isinstance(item, dict) and ("messages" in item or "prompt_token_ids" in item):
                prompts.append(item["messages"] if "messages" in item
                               else {"prompt_token_ids": item["prompt_token_ids"]})
            else:
                raise SystemExit(f"{args.prompts_file}: item {i} must be a string, "
                                 "{\"messages\": [...]} or {\"prompt_token_ids\": [...]}")
    for text in args.prompt:
        prompts.append([{"role": "user", "content": text}] if args.chat else text)
    if not prompts:
        raise SystemExit("no prompt: give PROMPT arguments or --prompts-file")
    return [{"messages": p} if isinstance(p, list) else p for p in prompts]


def cmd_generate(args: argparse.Namespace) -> int:
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError
    from nvllm.llm import LLM, CompletionOutput
    from nvllm.sampling_params import InvalidParameter, SamplingParams

    prompts = _read_prompts(args)
    bound = default_bound(args)
    try:
        params = SamplingParams(**sampling_kwargs(args))
        llm = LLM(args.model, max_model_len=args.max_model_len, num_blocks=args.num_blocks,
                  quantization=args.quantization, activations=args.activations, threads=args.threads,
                  kv_cache_dtype=args.kv_cache_dtype)
    except (ConfigError, EngineBuildError, InvalidParameter) as e:
        print(f"nvllm generate: {e}", file=sys.stderr)
        return 2
    try:
        per_prompt = [params] * len(prompts) if bound is None else _bounded(llm, prompts, params, bound)
        started = time.perf_counter()   # the figures of --stats leave out loading the model
        results = [CompletionOutput("") for _ in prompts]
        for i, out in llm.stream(prompts, per_prompt):
            results[i].update(out)
            if args.stream and not args.json:
                if len(prompts) > 1 and out.text:
                    sys.stdout.write(f"[{i}] ")
                sys.stdout.write(out.text + ("\n" if out.finished else ""))
                sys.stdout.flush()
    except InvalidParameter as e:
        print(f"nvllm generate: {e}", file=sys.stderr)
        return 2
    for r in results:
        if r.error:
            print(f"nvllm generate: request failed: {r.error}", file=sys.stderr)
        if args.json:
            obj = {"text": r.text, "token_ids": r.token_ids, "prompt_tokens": r.prompt_tokens,
                   "completion_tokens": r.completion_tokens, "cached_tokens": r.cached_tokens,
                   "finish_reason": r.finish_reason}
            if r.logprobs is not None:
                obj["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob,
                                    "top": [[t.token_id, t.logprob] for t in lp.top]} for lp in r.logprobs]
            print(json.dumps(obj, ensure_ascii=False))
        elif not args.stream:
            print(r.text)
    if bound is not None and any(r.finish_reason == "length" and r.completion_tokens >= bound for r in results):
        print(bound_note("generate", bound), file=sys.stderr)
    if args.stats:
        st = llm.stats()
        wall = time.perf_counter() - started
        print(f"[{len(prompts)} prompts, {st['prompt_tokens_computed']} prompt tokens computed, "
              f"{st['generated_tokens']} generated in {wall:.2f} s: {st['generated_tokens'] / wall:.1f} tokens/s "
              f"overall; prefix cache hit rate {st['prefix_cache_hit_rate']:.1%}, "
              f"{st['preemptions']} preemptions, {st['steps']} steps]", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def _bounded(llm: LLM, prompts: list[Any], params: SamplingParams, bound: int) -> list[SamplingParams]:
    """Each prompt's parameters with max_tokens the default bound, or the room its prompt leaves of the
    context where that is less (an explicit max_tokens past the room is refused; the default gives way)."""
    import dataclasses

    from nvllm.engine.prompt import generation_ids

    engine = llm.engine
    out = []
    for prompt in prompts:
        probe = dataclasses.replace(params, max_tokens=None)   # unset: generation_ids sets it to the room left
        generation_ids(engine.tokenizer, engine.model.config.vocab_size, prompt, probe, engine.max_model_len)
        assert probe.max_tokens is not None
        out.append(dataclasses.replace(params, max_tokens=min(bound, probe.max_tokens)))
    return out
