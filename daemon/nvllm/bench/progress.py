"""One status line for a long benchmark, on a terminal rewritten in place."""

from __future__ import annotations

import sys


class Progress:
    """One status line on a terminal, rewritten in place; elsewhere only the phases, one per line."""

    def __init__(self, enabled: bool) -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.quiet = not enabled

    def __call__(self, msg: str, tick: bool = False) -> None:
        if self.quiet or (tick and not self.tty):
            return
        if self.tty:
            sys.stderr.write("\r\033[K" + msg)
            sys.stderr.flush()
        else:
            print(msg, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
