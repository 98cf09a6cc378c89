"""What a decode step costs by its number of rows, as measured on this machine while serving: the
speculator's price list for verifying proposals.

A step's time is not proportional to its rows: the in-place kernels multiply rows of x in tiles (four
at a time), so on one board 4 rows cost 2.2x one row and 5 rows 4x. Rather than model that, the engine
reports each decode-only step's time by its row count, and this keeps a moving average per count. A
count never seen is priced optimistically (a little above the largest smaller one seen), so that it
gets tried once and then priced by what it really cost.
"""

from __future__ import annotations

ALPHA = 0.2          # weight of the newest step in a count's average
UNSEEN_STEP = 0.1    # an unseen count: the nearest smaller one's cost, plus this share per extra row


class StepCosts:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.seconds: list[float | None] = [None] * (max_rows + 1)   # by rows; [0] unused

    def observe(self, rows: int, seconds: float) -> None:
        if not 1 <= rows <= self.max_rows or seconds <= 0:
            return
        old = self.seconds[rows]
        self.seconds[rows] = seconds if old is None else old + ALPHA * (seconds - old)

    def estimate(self, rows: int) -> float | None:
        """Seconds a step of `rows` decode rows takes; None until a one-row step was seen."""
        rows = max(1, min(rows, self.max_rows))
        known = self.seconds[rows]
        if known is not None:
            return known
        below = next((r for r in range(rows - 1, 0, -1) if self.seconds[r] is not None), None)
        if below is None:
            return None
        base = self.seconds[below]
        assert base is not None
        return base * (1 + UNSEEN_STEP * (rows - below))
