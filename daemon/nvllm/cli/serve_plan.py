"""nvllm serve --dry-run: what serving would allocate (the model, its weights, the page pool per KV format,
the resident set), printed without allocating it."""

from __future__ import annotations

import sys
import time

from nvllm.config import Settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import RUNTIME_OVERHEAD_BYTES, available_memory, format_bytes
from nvllm.server.daemon import EXIT_CONFIG, EXIT_OK
from nvllm.server.models.served_models import served_name


def dry_run(settings: Settings, memory_gb: float | None = None) -> int:
    """Print what serving would allocate, without allocating it.

    On this machine (memory_gb None) the model is loaded, so the files are checked and the reading is
    the one serving would take. For another board nothing is loaded: the weights' size comes from
    config.json, and the memory available after they load is memory_gb GiB less the weights. Give the
    memory the board has free when nvllm starts (MemAvailable with its other programs running); its
    whole size gives an upper bound.
    """
    t0 = time.monotonic()
    try:
        if memory_gb is None:
            loaded = factory.load_model(settings)
            info = loaded.info
            reading = available_memory()
        else:
            info = factory.read_model_info(settings)
            reading = factory.board_reading(info, memory_gb)
        plan = factory.plan_pool(settings, info, reading)
    except factory.EngineBuildError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    sz, max_len = plan.sizing, plan.max_model_len
    resident = info.weight_bytes + sz.pool_bytes + RUNTIME_OVERHEAD_BYTES
    print(f"model: {served_name(settings)} ({info.path}), {info.architecture}, "
          f"{info.num_layers} layers, {info.num_params / 1e6:.1f} M parameters")
    print(f"weights: {format_bytes(info.weight_bytes)} ({info.weight_bytes} bytes held in memory), "
          f"as {info.weight_format}")
    if info.load_peak_bytes > info.weight_bytes:
        print(f"loading: the weights peak at {format_bytes(info.load_peak_bytes)} ({info.load_peak_bytes} bytes), "
              f"each matrix read as float32 before it is converted; that much must be free at start-up")
    print(sz.log_line())
    print(f"pool: {format_bytes(sz.pool_bytes)} ({sz.pool_bytes} bytes) in {sz.num_blocks} pages of "
          f"{sz.block_size} tokens, keys and values in {info.kv_format.name} ({info.bytes_per_token} bytes "
          f"per token, cache.dtype={settings.cache.dtype})")
    if info.kv_groups > 1:
        print(f"pages: {info.kv_groups} groups of {info.kv_slots} layers, one of each per block of a sequence; "
              f"the sliding ones give back the pages behind their window (cache.hybrid_kv_cache)")
    longest = info.longest_in(sz.num_blocks, sz.block_size, settings.scheduler.max_num_batched_tokens)
    print(f"context: {longest} tokens fit in one sequence; max_model_len {max_len} -> "
          f"{plan.full_length_seqs} sequences of full length at once")
    print(f"resident after start-up: at most {format_bytes(resident)} (weights + pool + "
          f"{format_bytes(RUNTIME_OVERHEAD_BYTES)} for the runtime: Python, NumPy, gRPC, tokenizer)")
    workspace = getattr(loaded.model, "workspace", None) if memory_gb is None else None   # a decoder's
    if workspace is not None:
        budget = settings.scheduler.max_num_batched_tokens
        print(f"forward scratch: {format_bytes(workspace.bytes_for(budget))} for steps of up to "
              f"{budget} tokens (scheduler.max_num_batched_tokens), made once at start-up")
    if memory_gb is None and loaded.footprint is not None:
        print("held besides the weights, pool and forward scratch (measured here while loading; serving adds "
              "its servers' imports and threads):")
        for line in loaded.footprint.lines():
            print("  " + line)
    print(f"per KV format: a row each from the same reading (cache.dtype={settings.cache.dtype} gives "
          f"{info.kv_format.name}, the plan above)")
    for line in format_rows(factory.plan_per_format(settings, info, reading), info.weight_bytes, max_len):
        print("  " + line)
    if memory_gb is None:
        print(f"startup: weights and tokenizer loaded in {loaded.load_s:.2f} s "
              f"({time.monotonic() - t0:.2f} s with sizing; serving also maps the pool and backs one "
              f"max_model_len sequence's pages before it is ready, the rest in the background)")
    else:
        print(f"startup: not measured (planned for {memory_gb:g} GiB available; nothing was loaded)")
    return EXIT_OK


def format_rows(plans: dict[str, factory.PoolPlan | str], weight_bytes: int, max_len: int) -> list[str]:
    """One line per KV format: its pool, the full-length sequences it holds and the resident set."""
    rows = []
    for name, plan in plans.items():
        fmt = factory.KV_FORMATS[name]
        per_value = f"{fmt.block.block_bytes / fmt.per_element:g} bytes a value"
        if isinstance(plan, str):
            rows.append(f"{name:5} {per_value}: no pool ({plan})")
            continue
        sz = plan.sizing
        resident = weight_bytes + sz.pool_bytes + RUNTIME_OVERHEAD_BYTES
        rows.append(f"{name:5} {per_value}: {sz.num_blocks} blocks of {sz.bytes_per_block} bytes = "
                    f"{format_bytes(sz.pool_bytes)}, {plan.full_length_seqs} "
                    f"sequences of {max_len} tokens, resident at most {format_bytes(resident)}; "
                    f"{sz.decided_by()}")
    return rows
