"""sd_notify over $NOTIFY_SOCKET, and a watchdog that pings only while the engine makes progress.

The protocol (systemd's sd_notify(3)) is one datagram of newline-separated ``KEY=value`` lines sent to the
unix socket named by $NOTIFY_SOCKET: a filesystem path, or an abstract name written with a leading '@'.
Nothing here needs libsystemd; everything is a no-op when NOTIFY_SOCKET is unset (a foreground run, tests),
and no send ever raises: the first failure is logged as a warning, later ones at debug level.

How server/daemon.py is meant to use it (deploy/nvllm.service has Type=notify, NotifyAccess=main, WatchdogSec):

    notifier = Notifier()
    notifier.status("loading model ...")             # while loading; extend_timeout() if a load runs long
    ... load the model, size and touch the pool, bind the gRPC port(s) ...
    notifier.ready("serving on 127.0.0.1:50051")      # only after every listener is bound
    pinger = WatchdogPinger.from_env(notifier, lambda: engine.num_loop_iterations)  # None if no WatchdogSec
    if pinger: pinger.start()
    every ~5 s:  notifier.status("3 running, 1 waiting, pool 41% used, admission open")
    on SIGTERM:  notifier.stopping(); notifier.status("draining N requests"); drain; pinger.stop()

Send READY=1 from the main process (NotifyAccess=main makes systemd drop datagrams from other PIDs;
threads of the main process are fine). Keep the pinger running while draining: the engine still loops.
Call faulthandler.enable(all_threads=True) at start-up: when the watchdog fires, systemd sends SIGABRT,
and the stacks it prints to stderr (the journal) show where the engine hung.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def _socket_address(value: str) -> str | bytes | None:
    """$NOTIFY_SOCKET -> an address for sendto(), or None for forms we do not speak (vsock:...)."""
    if value.startswith("@"):
        # Linux abstract namespace: a leading NUL byte instead of '@', no trailing NUL.
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """systemd's watchdog timeout in seconds ($WATCHDOG_USEC), or None when no watchdog is set for us.

    $WATCHDOG_PID, when present, names the process the watchdog is meant for; any other process (a child
    that inherited the environment) gets None. Ping at half this interval, as sd_watchdog_enabled(3) asks.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000


class Notifier:
    """Sends sd_notify messages to the service manager; every method is a no-op without $NOTIFY_SOCKET."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        raw = self._environ.get("NOTIFY_SOCKET", "")
        self._address = _socket_address(raw) if raw else None
        if raw and self._address is None:
            log.warning("NOTIFY_SOCKET=%r is not a unix socket address; systemd notifications are off", raw)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed_once = False
        self.num_sent = 0

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def ready(self, status: str | None = None) -> bool:
        """READY=1: start-up is complete. Call once, after the listeners are bound."""
        return self.notify("READY=1", *self._status_line(status))

    def status(self, text: str) -> bool:
        """STATUS=...: one line that `systemctl status nvllm` shows. Cheap; send every few seconds."""
        return self.notify(*self._status_line(text))

    def watchdog(self) -> bool:
        """WATCHDOG=1: keep-alive. Prefer WatchdogPinger, which sends it only while the engine progresses."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: shutdown began (first thing in the SIGTERM handler, before draining)."""
        return self.notify("STOPPING=1", *self._status_line(status))

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for `seconds` more before start-up (or stop) counts as timed out."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1_000_000))}")

    def watchdog_interval(self) -> float | None:
        return watchdog_interval(self._environ)

    def notify(self, *lines: str) -> bool:
        """Send the lines as one datagram. True if it was sent; False when disabled or the send failed."""
        if self._address is None or not lines:
            return False
        payload = "\n".join(lines).encode("utf-8", "replace")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # sendto each time rather than connect once: a re-executed systemd makes a new socket inode.
                self._sock.sendto(payload, self._address)
            except OSError as e:
                self._report_failure(e)
                return False
            self.num_sent += 1
            return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _report_failure(self, error: OSError) -> None:
        level = logging.DEBUG if self._failed_once else logging.WARNING
        self._failed_once = True
        log.log(level, "sd_notify to %s failed: %s", self._environ.get("NOTIFY_SOCKET"), error)

    @staticmethod
    def _status_line(text: str | None) -> tuple[str, ...]:
        if text is None:
            return ()
        # A newline would end the assignment and start a bogus one.
        return ("STATUS=" + " ".join(text.splitlines()),)


class WatchdogPinger:
    """A thread that sends WATCHDOG=1 every `interval` seconds, but only if `progress()` moved since the last.

    `progress` returns a counter the engine loop bumps on every iteration, idle wake-ups included; when the
    loop hangs (a stuck matmul, a deadlock) the counter stops, the pings stop, and after WatchdogSec systemd
    kills and restarts the unit (Restart=on-failure). For an idle engine not to look stalled, its idle wait
    must wake at least every interval/2 (a quarter of WatchdogSec with the interval from from_env) and bump
    the counter then too: e.g. `queue.get(timeout=interval / 2)` in the engine thread.

    Reading an int another thread writes is safe under the GIL; only a change matters, not the value.
    """

    def __init__(self, notifier: Notifier, progress: Callable[[], int], interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.notifier = notifier
        self.progress = progress
        self.interval = interval
        self.num_checks = 0
        self.num_pings = 0
        self.stalled = False
        self._last: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, notifier: Notifier, progress: Callable[[], int]) -> WatchdogPinger | None:
        """A pinger at half of systemd's WatchdogSec, or None when systemd set no watchdog for us."""
        timeout = notifier.watchdog_interval()
        if timeout is None or not notifier.enabled:
            return None
        return cls(notifier, progress, timeout / 2)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._last = self.progress()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvllm-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> bool:
        """One tick: ping if the counter advanced since the previous tick. Returns whether it pinged.

        start() takes the baseline; called by hand (tests), the first check only takes it.
        """
        current = self.progress()
        previous, self._last = self._last, current
        self.num_checks += 1
        if previous is None:  # the first look only takes the baseline
            return False
        if current == previous:
            if not self.stalled:
                log.error("engine loop made no progress in %.1f s; withholding the watchdog ping", self.interval)
            self.stalled = True
            return False
        if self.stalled:
            log.warning("engine loop progresses again; watchdog pings resume")
        self.stalled = False
        self.notifier.watchdog()
        self.num_pings += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a broken progress() must not kill the thread silently
                log.exception("watchdog check failed")
