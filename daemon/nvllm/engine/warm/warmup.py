"""The cache's work around the engine's life: at start, the persisted prefix cache read back
(engine/warm/prefix_store.py) and the pinned prompts computed and held (cache.pinned_prompts); at drain, the
pinned and the hottest cached pages written out (cache.persist_dir).

It runs on the engine thread, a bounded share at the top of each step (LLMEngine.step), so readiness
never waits for it and requests are served meanwhile: one that arrives before a page is in simply
misses it (or shares the pinned prompt's pages as they are computed). The file's pinned pages go in
first, then the pinned prompts run as internal requests (their outputs are dropped here), so a prompt
found in the file is not computed again. Each pinned prompt's full pages are then held by a reference
of the warm-up's own (`holds`, as a sequence would hold them): no eviction takes them, and the pool's
sizing counts them (engine/assembly/factory.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from nvllm.engine.block_manager import BlockManager
from nvllm.engine.outputs import RequestOutput
from nvllm.engine.sequence import PRIORITY_MIN, Sequence
from nvllm.engine.warm.pinned_prompts import PinnedPrompt
from nvllm.engine.warm.prefix_store import FILE_NAME, StoreLoad, page_bytes, select_pages, write_store
from nvllm.model.kv_cache import KVCache
from nvllm.sampling_params import SamplingParams

log = logging.getLogger("nvllm.engine.warm.warmup")

ID_PREFIX = "nvllm-pinned-"      # the internal requests' ids; a client's id may not clash while they run


class _Engine(Protocol):
    block_manager: BlockManager
    kv_cache: KVCache

    def make_sequence(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                      priority: int = 0) -> Sequence: ...

    def add_sequence(self, seq: Sequence) -> None: ...


class Hold:
    """A pinned prompt's pages, owned by the engine (the block manager's view of a sequence)."""

    def __init__(self, prompt: PinnedPrompt, token_ids: list[int]) -> None:
        self.prompt = prompt
        self.token_ids = token_ids
        self.block_tables: list[list[int]] = []
        self.block_hashes: list[bytes] = []
        self.num_computed_tokens = 0


class Warmup:
    def __init__(self, engine: _Engine, pinned: list[PinnedPrompt], persist_dir: str = "",
                 persist_max_bytes: int = 0, identity: dict[str, Any] | None = None, vocab: int = 0) -> None:
        self.engine = engine
        self.bm = engine.block_manager
        self.kv = engine.kv_cache
        self.identity = identity or {}
        self.persist_max_bytes = persist_max_bytes
        self.path = Path(persist_dir) / FILE_NAME if persist_dir else None
        self.load = None if self.path is None else StoreLoad(self.path, self.identity, self.kv, self.bm, vocab)
        self.todo = [p for p in pinned if p.token_ids]
        self.computing: dict[str, tuple[PinnedPrompt, Sequence]] = {}
        self.holds: list[Hold] = []
        self.ids: set[str] = set()       # internal requests whose final output has not passed own()
        self._numbers = itertools.count()

    @property
    def busy(self) -> bool:
        """Work left that a step moves on (a load waiting for the pool's backing is not)."""
        loading = self.load is not None and not self.load.waiting
        return loading or bool(self.todo) or bool(self.computing)

    @property
    def pinned_pages(self) -> list[int]:
        return [b for h in self.holds for t in h.block_tables for b in t if b != self.bm.null]

    def advance(self) -> None:
        """One share of the start-up work; before the step schedules."""
        if self.load is not None and not self.load.advance():
            self.load = None
        if self.todo and (self.load is None or self.load.past_pinned or self.load.waiting):
            for p in self.todo:
                if self._held(p, 0):   # every page came from the file: nothing to compute
                    continue
                rid = f"{ID_PREFIX}{next(self._numbers)}"
                # First in line: a request admitted in the same step then shares the pages computed.
                seq = self.engine.make_sequence(rid, {"prompt_token_ids": list(p.token_ids)},
                                                SamplingParams(temperature=0.0, max_tokens=1), PRIORITY_MIN)
                self.engine.add_sequence(seq)
                self.computing[rid] = (p, seq)
                self.ids.add(rid)
            self.todo = []
        for rid, (p, seq) in list(self.computing.items()):
            if seq.is_finished:
                del self.computing[rid]
                self._hold(p, seq)

    def own(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The step's outputs less the internal requests' (each id dropped until its final output)."""
        if not self.ids:
            return outputs
        kept = []
        for o in outputs:
            if o.request_id not in self.ids:
                kept.append(o)
            elif o.finished:
                self.ids.discard(o.request_id)
        return kept

    def _hold(self, p: PinnedPrompt, seq: Sequence) -> None:
        if seq.finish_reason == "abort":
            log.error("pinned prompt %s not computed (%s): it is not pinned", p.path, seq.error or "aborted")
            return
        if not self._held(p, seq.num_cached_tokens, partial=True):
            log.warning("pinned prompt %s: some of its pages were evicted before they were held", p.path)

    def _held(self, p: PinnedPrompt, cached: int, partial: bool = False) -> bool:
        """Hold the prompt's full pages if all are cached (or, partial, those that are); whether held."""
        bs = self.bm.block_size
        # The prompt and one token more: lookup then finds every full page (it leaves one token to compute).
        hold = Hold(p, [*p.token_ids, 0])
        hits = self.bm.lookup(hold)
        found_tokens = len(hits[0]) * bs
        if found_tokens < len(p.token_ids) and not (partial and found_tokens):
            return False
        ok = self.bm.admit(hold, hits, found_tokens, record=False)
        assert ok, "cached pages are always admissible"
        self.holds.append(hold)
        found = "all from the persisted cache" if cached == 0 and not partial else f"{cached} tokens found cached"
        pages = sum(b != self.bm.null for run in hits for b in run)
        log.info("pinned prompt %s: %d tokens, %d pages held (%s)", p.path, p.num_prompt_tokens, pages, found)
        return found_tokens == len(p.token_ids)

    def save(self) -> None:
        """Write the pinned and the hottest cached pages to persist_dir (after the engine stopped); a
        failure is logged, never raised: the drain goes on."""
        if self.path is None:
            return
        t0 = time.monotonic()
        try:
            per = page_bytes(self.kv)
            pages = select_pages(self.bm, self.pinned_pages, self.persist_max_bytes, per)
            size = write_store(self.path, self.identity, self.kv, self.bm, pages, len(self.pinned_pages))
        except (OSError, ValueError) as e:
            log.error("prefix cache not written to %s: %s", self.path, e)
            return
        log.info("prefix cache: %d pages (%d pinned, %.1f MB) written to %s in %.2f s", len(pages),
                 len(self.pinned_pages), size / 1e6, self.path, time.monotonic() - t0)
