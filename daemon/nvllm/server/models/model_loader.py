"""How the daemon loads a model into the memory plan and gives it back (model_set.py decides when).

Loading: the weights and tokenizer (engine/assembly/factory.py, on an executor thread), a page pool planned
from the memory reading as for a single model but never past what the budget has free beside the
weights, the engine, its thread. Unloading: the thread stopped, what it ran aborted, the pool's backing
stopped, every reference dropped, then the garbage collected and, with glibc, the heap trimmed, so the
weights and the pool go back to the operating system (the pool is an anonymous mapping, unmapped when
its array goes; the weights are heap arrays, which malloc keeps unless trimmed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import MemoryReading, MiB, format_bytes, give_back_memory
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.models.file_signature import FileSignature, file_signature
from nvllm.server.models.model_set import ModelSpec

log = logging.getLogger("nvllm.server.models")


class ModelLoader:
    def __init__(self, memory_reader: Callable[[], MemoryReading], heartbeat_s: float = 1.0,
                 on_step: Callable[[float, int, str], None] | None = None) -> None:
        """on_step(seconds, tokens, model name): each engine's steps (the daemon's metrics)."""
        self.memory_reader = memory_reader
        self.heartbeat_s = heartbeat_s
        self.on_step = on_step
        # (name, path, its files' signature): a model pulled anew, or a new version of its files, is read anew
        self._least: dict[tuple[str, str, FileSignature], int] = {}

    def least(self, spec: ModelSpec) -> int:
        """Its weights and one max_model_len sequence's pages (cache.num_blocks' where set), read from its
        files (nothing loaded)."""
        key = (spec.name, spec.settings.model.path, file_signature(spec.settings.model_path()))
        if key not in self._least:
            s = spec.settings
            info = factory.read_model_info(s)
            blocks = s.cache.num_blocks or info.blocks_for(factory.max_model_len(s, info), s.cache.block_size,
                                                           s.scheduler.max_num_batched_tokens)
            self._least[key] = info.weight_bytes + blocks * s.cache.block_size * info.bytes_per_token
        return self._least[key]

    async def load(self, spec: ModelSpec, free_bytes: int) -> tuple[AsyncEngine, int]:
        """The model loaded, its pool within free_bytes less its weights, its engine thread started;
        (the engine, the bytes it holds). EngineBuildError when it cannot be (its files, or no room)."""
        loop = asyncio.get_running_loop()
        s = spec.settings
        loaded = await loop.run_in_executor(None, factory.load_model, s)
        info = loaded.info
        room = free_bytes - info.weight_bytes - info.draft_pool_bytes - info.cross_bytes
        if room < MiB:
            raise factory.EngineBuildError(
                f"model {spec.name}: its weights ({format_bytes(info.weight_bytes)}) leave no room for a page "
                f"pool in the {format_bytes(free_bytes)} of the memory budget free")
        cap = room // MiB if not s.cache.max_pool_mb else min(s.cache.max_pool_mb, room // MiB)
        capped = dataclasses.replace(s, cache=dataclasses.replace(s.cache, max_pool_mb=cap))
        plan = factory.plan_pool(capped, info, self.memory_reader())
        if plan.sizing.pool_bytes > room:       # cache.num_blocks wins over the sizing, not over the budget
            raise factory.EngineBuildError(
                f"model {spec.name}: cache.num_blocks = {s.cache.num_blocks} makes a page pool of "
                f"{format_bytes(plan.sizing.pool_bytes)}, past the {format_bytes(room)} the memory budget has "
                f"free beside its weights")
        log.info("model %s: %s", spec.name, plan.sizing.log_line())
        if loaded.footprint is not None:
            log.info("model %s: held besides the weights, pool and scratch: %s", spec.name,
                     "; ".join(loaded.footprint.lines()))
        engine = await loop.run_in_executor(None, factory.create_engine, capped, loaded, plan)
        on_step, name = self.on_step, spec.name
        async_engine = AsyncEngine(engine, heartbeat_s=self.heartbeat_s,
                                   on_step=None if on_step is None else lambda s, t: on_step(s, t, name))
        async_engine.start(loop)
        return async_engine, info.weight_bytes + info.draft_pool_bytes + info.cross_bytes + plan.sizing.pool_bytes

    async def unload(self, engine: AsyncEngine) -> None:
        """Its thread and pool backing stopped, what it ran aborted; the memory goes back once the last
        reference to it is gone (reclaim)."""
        await asyncio.get_running_loop().run_in_executor(None, engine.stop_thread)
        engine.abort_leftovers()

    async def reclaim(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, give_back_memory)
