"""What the process holds besides the weights, the page pool and the forward scratch, measured while a model
loads: the interpreter and the modules imported, the tokenizer's vocabulary, the grammar compiler (none until a
request asks for structure), and what loading left behind (threads' stacks, C and BLAS buffers, the allocator's
free lists). `nvllm serve --dry-run` prints these lines and the daemon logs them once a model is loaded, so the
resident set is accounted for line by line rather than by one allowance (memory.RUNTIME_OVERHEAD_BYTES).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

from nvllm.engine.assembly.memory import MiB, give_back_memory

T = TypeVar("T")


def resident_bytes() -> int:
    """The process's resident set now."""
    return int(psutil.Process().memory_info().rss)


def measured(make: Callable[[], T]) -> tuple[T, int]:
    """make()'s result and what it holds resident: the heap trimmed before and after, so that neither what was
    freed earlier nor make()'s own garbage counts (a few milliseconds each)."""
    give_back_memory()
    at = resident_bytes()
    made = make()
    give_back_memory()
    return made, resident_bytes() - at


@dataclass(frozen=True)
class Footprint:
    """Resident bytes measured at three moments of a model's load (factory.load_model)."""
    before_load: int       # the interpreter and every module imported so far
    tokenizer: int         # what building the tokenizer added: its vocabulary, merges and chat template
    weight_bytes: int      # the weights as held (exact, not measured)
    after_load: int        # the resident set once loaded

    @property
    def other(self) -> int:
        """What loading left besides the tokenizer and the weights: threads' stacks, C and BLAS buffers, and
        memory freed to the allocator but not yet handed back. Negative when loading gave back more than it
        kept (the imports' own garbage, say)."""
        return self.after_load - self.before_load - self.tokenizer - self.weight_bytes

    @property
    def besides_weights(self) -> int:
        """Everything held after the load but the weights."""
        return self.after_load - self.weight_bytes

    def lines(self) -> list[str]:
        """One line per part, each with its MiB; with the weights they add up to the resident set after load."""
        grammar = ("loaded (a request asked for structure)" if "llguidance" in sys.modules else
                   "0 MiB: llguidance is imported, and its view of the vocabulary built, on the first request "
                   "that asks for structure")
        return [
            f"interpreter and imports: {_mib(self.before_load)} (resident when the load began)",
            f"tokenizer and vocabulary: {_mib(self.tokenizer)} (what building it added: tokens, merges, "
            f"the chat template)",
            f"grammar compiler: {grammar}",
            f"other: {_mib(self.other)} (what loading left besides: {threading.active_count()} Python threads' "
            f"stacks, C and BLAS buffers, memory freed to the allocator and kept)",
            f"total besides the weights: {_mib(self.besides_weights)}; with the {_mib(self.weight_bytes)} of "
            f"weights, {_mib(self.after_load)} resident after the load",
        ]


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"
