"""What a decode step costs by its number of rows, as measured on this machine while serving: the
speculator's price list for verifying proposals.

A step's time is not proportional to its rows: the in-place kernels multiply rows of x in tiles, so on
one board 4 rows cost 2.2x one row and 5 rows 4x (a 2-core EPYC with SmolLM2 Q4_1: 2 rows 1.05x, 5 rows
1.7x). Rather than model that, the engine reports each decode-only step's time by its row count, and
this prices each count by the fastest of its last WINDOW steps. The fastest, not an average: on a board
shared with other work a step is only ever slowed (descheduled, another process's burst), and one such
step in an average would price its count far too high for many steps; a count priced too high is not
chosen again and so never measured again, and speculation would stand aside where it pays. The window
still follows a real change (a longer context, a hotter board) within WINDOW steps of the count.

A count never seen is priced optimistically (a little above the largest smaller one seen), and so is one
seen fewer than TRIES times if that is lower, so that it gets tried and then priced by what it really
cost, not by one unlucky step.
"""

from __future__ import annotations

from collections import deque

WINDOW = 8           # a count's steps kept: its price is the fastest of them
TRIES = 2            # steps of a count before its own price stands above the optimistic guess
UNSEEN_STEP = 0.1    # an unseen count: the nearest smaller one's cost, plus this share per extra row


class StepCosts:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.recent: list[deque[float]] = [deque(maxlen=WINDOW) for _ in range(max_rows + 1)]   # by rows

    def observe(self, rows: int, seconds: float) -> None:
        if 1 <= rows <= self.max_rows and seconds > 0:
            self.recent[rows].append(seconds)

    def estimate(self, rows: int) -> float | None:
        """Seconds a step of `rows` decode rows takes; None until a step of no more rows was seen."""
        rows = max(1, min(rows, self.max_rows))
        price, at = None, 0   # the price of the largest count seen so far, walking up to rows
        for r in range(1, rows + 1):
            seen = self.recent[r]
            if not seen:
                continue
            known = min(seen)
            if price is not None and len(seen) < TRIES:
                known = min(known, price * (1 + UNSEEN_STEP * (r - at)))
            price, at = known, r
        return None if price is None else price * (1 + UNSEEN_STEP * (rows - at))

    @property
    def seconds(self) -> list[float | None]:
        """Each count's own price, by rows ([0] unused); None for a count never measured."""
        return [min(s) if s else None for s in self.recent]
