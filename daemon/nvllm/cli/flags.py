"""Flags that several subcommands share: sampling, quantization, activations, the KV cache's format and threads."""

from __future__ import annotations

import argparse
from typing import Any

# What nvllm query and nvllm generate generate at most unless --max-tokens says otherwise. Greedy decoding of
# a small model can loop until the context is full (4,096 tokens for the default model: minutes on a
# board); 256 tokens hold a few paragraphs, a whole answer to most questions, in seconds. The HTTP and
# gRPC APIs keep their convention (unset: up to the end of the context); --max-tokens 0 asks for that.
DEFAULT_MAX_TOKENS = 256


def add_sampling_flags(p: argparse.ArgumentParser, greedy_default: bool) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS}, or --min-tokens if more; "
                        "fewer where the context has less room left; 0: up to the end of the context)")
    g.add_argument("--min-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=0.0 if greedy_default else None,
                   help="0 = greedy" + (" (the default here)" if greedy_default else ""))
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    g.add_argument("--stop-token-id", type=int, action="append", default=None, dest="stop_token_ids")
    g.add_argument("--ignore-eos", action="store_true", default=None)
    g.add_argument("--include-stop-str", action="store_true", default=None, dest="include_stop_str_in_output")
    g.add_argument("--logprobs", type=int, default=None, help="top-N logprobs per token")


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags given, by SamplingParams' own field names (the flags' dests)."""
    from dataclasses import fields

    from nvllm.sampling_params import SamplingParams

    kw = {f.name: getattr(args, f.name) for f in fields(SamplingParams) if getattr(args, f.name, None) is not None}
    if kw.get("max_tokens") == 0:   # --max-tokens 0: up to the end of the context, the APIs' unset
        del kw["max_tokens"]
    return kw


def default_bound(args: argparse.Namespace) -> int | None:
    """The bound a command puts on the answer when --max-tokens is not given (DEFAULT_MAX_TOKENS, or
    --min-tokens where that is more), to be cut to the room the prompt leaves; None when it is given."""
    if getattr(args, "max_tokens", None) is not None:
        return None
    return max(DEFAULT_MAX_TOKENS, getattr(args, "min_tokens", None) or 0)


def bound_note(command: str, bound: int) -> str:
    """What stderr says when an answer stopped at the default bound (stdout keeps the answer alone)."""
    return (f"nvllm {command}: stopped at {bound} tokens, the default --max-tokens (finish_reason length); "
            f"--max-tokens N allows up to N, --max-tokens 0 up to the end of the context")


def add_quantization_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", default=None, metavar="FORMAT",
                   help="a folder's weights in memory: f32, or re-quantized at load to q8_0, q4_0, q4_k, bf16 "
                        "or f16 (model.quantization; default: as stored, 16-bit matrices kept 16-bit)")


def add_activations_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--activations", default=None, choices=("exact", "int8", "float"),
                   help="how quantized weights meet x (model.activations): exact (x in 16-bit blocks: the "
                        "float path's answers; the default), int8 (8-bit, as llama.cpp: faster in prefill and "
                        "many streams, flips near-tied tokens) or float (the reference)")


def add_kv_cache_dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-dtype", default=None, choices=("auto", "f32", "f16", "bf16", "q8_0"),
                   help="what the KV page pool stores keys and values in (cache.dtype): auto (f16 for a GGUF, "
                        "the weights' float type for a folder), f32, f16, bf16 or q8_0 (34 bytes per 32 values)")


def add_threads_flag(p: argparse.ArgumentParser, default: int | None = None) -> None:
    p.add_argument("--threads", "--blas-threads", dest="threads", type=int, default=default, metavar="N",
                   help="threads for the matmuls (model.threads; 0: one per usable core but one, the cgroup's "
                        "CPU quota counted); --blas-threads is its old name")
