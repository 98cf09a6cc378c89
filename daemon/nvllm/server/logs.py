"""Logging for the daemon: one line per event on stdout, in the form journald keeps well.

Under systemd (stdout is the journal stream named by $JOURNAL_STREAM) each line starts with the sd-daemon(3)
priority prefix, so `journalctl -u nvllm -p warning` filters by level and journald adds the timestamp:

    <6>nvllm.server.service [request_id=7f3a]: finished: stop, 12 prompt + 40 output tokens

Anywhere else (a terminal, a container, a test) the same line reads

    INFO nvllm.server.service [request_id=7f3a]: finished: stop, 12 prompt + 40 output tokens

A record never spans lines: newlines in the message and the traceback of an exception are folded into the
one line with " | ", so a journal reader or a grep never sees half an event.

Request ids: the gRPC servicer wraps each request in `with request_context(request_id):` (a contextvar,
so it follows the request through awaits and into the asyncio tasks it creates); code that runs
elsewhere, the engine thread, passes `extra={"request_id": ...}` with its record. Lines outside a
request carry no id.

cli/serve.py calls `setup_logging(settings.log_level)` first thing in `nvllm serve`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("nvllm_request_id", default=None)

# sd-daemon(3) priorities, as syslog numbers them.
_JOURNAL_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

SEPARATOR = " | "


def journal_priority(levelno: int) -> int:
    """The syslog priority for a logging level; levels between the named ones round to the nearer severe."""
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _JOURNAL_PRIORITY[level]
    return _JOURNAL_PRIORITY[logging.DEBUG]


def stream_is_journal(stream: IO[str]) -> bool:
    """True when `stream` is the journald stream systemd connected, as $JOURNAL_STREAM ("dev:inode") says.

    Comparing device and inode, not only checking that the variable is set, keeps a child process whose
    output was redirected elsewhere from writing priority prefixes into a file.
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    if not value:
        return False
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def one_line(text: str) -> str:
    return SEPARATOR.join(part for part in text.splitlines() if part.strip())


class OneLineFormatter(logging.Formatter):
    """`<prio>name [request_id=..]: message | traceback` for journald, `LEVEL name ...` otherwise."""

    def __init__(self, journal: bool) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        parts = [record.getMessage()]
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        message = one_line("\n".join(parts))
        request_id = getattr(record, "request_id", None)
        where = record.name if request_id is None else f"{record.name} [request_id={request_id}]"
        if self.journal:
            return f"<{journal_priority(record.levelno)}>{where}: {message}"
        return f"{record.levelname} {where}: {message}"


class RequestIdFilter(logging.Filter):
    """Stamps records with the request id of the current context, unless the caller gave one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = _request_id.get()
        return True


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Every line logged inside the block (and in tasks it starts) carries `request_id`."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


class _Handler(logging.StreamHandler):
    """Marks the handler setup_logging installed, so a second call replaces it instead of adding one."""


def setup_logging(level: str = "info", stream: IO[str] | None = None,
                  journal: bool | None = None) -> logging.Handler:
    """Route all logging (ours, grpc's, warnings.warn) to one line per record on `stream` (stdout).

    `journal` forces or forbids the priority prefix; by default it is used when the stream is $JOURNAL_STREAM.
    Calling it again replaces the handler it installed before (tests, a reload).
    """
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    out = sys.stdout if stream is None else stream
    handler = _Handler(out)
    handler.setFormatter(OneLineFormatter(stream_is_journal(out) if journal is None else journal))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    logging.captureWarnings(True)
    return handler


def announce(line: str, stream: IO[str] | None = None) -> None:
    """Print one line that tools read (the "nvllm serving ... on ADDRESS" line) in a single write under the
    log handler's lock: print() writes the text and the newline apart, and with unbuffered output a log
    line from another thread (the prefix store loading) could land between them."""
    out = sys.stdout if stream is None else stream
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, _Handler) and h.stream is out]
    with contextlib.ExitStack() as held:
        for h in handlers:
            if h.lock is not None:
                held.enter_context(h.lock)
        out.write(line + "\n")
        out.flush()
