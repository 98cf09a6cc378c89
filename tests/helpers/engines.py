"""An engine for tests that count what a step did: built as the daemon builds it, then waited on until
its whole page pool is backed. The pool is backed by a thread at nice 10 (engine/assembly/pool_backing.py);
on a busy machine the steps run first, with the few blocks backed at start, so counts that depend on free
pages (seats, proposals) would depend on the machine's load."""
from __future__ import annotations

from nvllm.config import Settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.assembly.pool_backing import PoolBacking
from nvllm.engine.llm_engine import LLMEngine


def backed_engine(settings: Settings) -> LLMEngine:
    eng = build_engine(settings)
    if eng.backing is not None:
        assert isinstance(eng.backing, PoolBacking) and eng.backing.wait(60), "the pool was not backed within 60 s"
        assert eng.backing.error is None, eng.backing.error
    return eng
