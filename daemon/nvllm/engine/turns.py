"""Whose step it is: the engines of several loaded models each have their thread, but the kernels' threads
are one team for the whole process (model/kernels' C thread team, csrc/team.c), and a board's few cores
do more for one step at a time than split between two. So each engine thread takes a turn for its step,
first come first served (a ticket queue: a lock a busy thread could take again at once would starve the other model)."""

from __future__ import annotations

import threading
from typing import Any


class Turns:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0         # the next ticket handed out
        self._serving = 0      # the ticket whose turn it is

    def __enter__(self) -> Turns:
        with self._cond:
            ticket = self._next
            self._next += 1
            self._cond.wait_for(lambda: self._serving == ticket)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


STEPS = Turns()   # every engine of the process steps in its turn
