"""nvllm.server.systemd (sd_notify, watchdog pinger) and nvllm.server.logs (journald-friendly lines).

The notify tests bind a real unix datagram socket, as systemd does, and point NOTIFY_SOCKET at it.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvllm.server import logs
from nvllm.server.systemd import Notifier, WatchdogPinger, watchdog_interval

WAIT_S = 10.0  # upper bound for a datagram that must come; never reached when things work


class Receiver:
    """The service manager's end: a bound AF_UNIX datagram socket."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env_value = env_value

    def recv(self) -> str:
        self.sock.settimeout(WAIT_S)
        return self.sock.recv(4096).decode()

    def pending(self) -> list[str]:
        """Every datagram already queued, without waiting."""
        out = []
        self.sock.setblocking(False)
        try:
            while True:
                out.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return out


@pytest.fixture(params=["path", "abstract"])
def receiver(request, tmp_path: Path, monkeypatch) -> Iterator[Receiver]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
        value = address
    else:
        name = f"nvllm-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        value = "@" + name
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield Receiver(sock, value)
    sock.close()


def wait_until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


class TestNotifier:
    def test_ready_status_watchdog_stopping_arrive_as_datagrams(self, receiver: Receiver) -> None:
        n = Notifier()
        assert n.enabled
        assert n.ready()
        assert receiver.recv() == "READY=1"
        assert n.status("serving: 2 running, 0 waiting")
        assert receiver.recv() == "STATUS=serving: 2 running, 0 waiting"
        assert n.watchdog()
        assert receiver.recv() == "WATCHDOG=1"
        assert n.stopping()
        assert receiver.recv() == "STOPPING=1"
        assert n.num_sent == 4

    def test_ready_with_status_is_one_datagram(self, receiver: Receiver) -> None:
        Notifier().ready("serving on 127.0.0.1:50051")
        assert receiver.recv() == "READY=1\nSTATUS=serving on 127.0.0.1:50051"
        assert receiver.pending() == []

    def test_status_with_newlines_stays_one_assignment(self, receiver: Receiver) -> None:
        Notifier().status("line one\nline two")
        assert receiver.recv() == "STATUS=line one line two"

    def test_extend_timeout_sends_microseconds(self, receiver: Receiver) -> None:
        Notifier().extend_timeout(90)
        assert receiver.recv() == "EXTEND_TIMEOUT_USEC=90000000"

    def test_without_notify_socket_everything_is_a_no_op(self, monkeypatch) -> None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
        n = Notifier()
        assert not n.enabled
        assert not n.ready("x") and not n.status("x") and not n.watchdog() and not n.stopping()
        assert n.num_sent == 0

    def test_send_failure_never_raises_and_warns_once(self, tmp_path: Path, monkeypatch, caplog) -> None:
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
        n = Notifier()
        with caplog.at_level(logging.DEBUG, logger="nvllm.server.systemd"):
            assert not n.ready()
            assert not n.status("still no one")
            assert not n.watchdog()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "sd_notify" in warnings[0].getMessage()

    def test_non_unix_address_disables_notifications(self, monkeypatch, caplog) -> None:
        monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:9999")
        with caplog.at_level(logging.WARNING, logger="nvllm.server.systemd"):
            n = Notifier()
        assert not n.enabled and not n.ready()
        assert "not a unix socket" in caplog.text


class TestWatchdogInterval:
    def test_seconds_from_watchdog_usec(self) -> None:
        assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0

    def test_pid_must_be_ours(self) -> None:
        env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
        assert watchdog_interval(env) == 30.0
        env["WATCHDOG_PID"] = str(os.getpid() + 1)
        assert watchdog_interval(env) is None

    @pytest.mark.parametrize("env", [{}, {"WATCHDOG_USEC": ""}, {"WATCHDOG_USEC": "soon"},
                                     {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "-5"},
                                     {"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}])
    def test_none_without_a_valid_watchdog(self, env: dict[str, str]) -> None:
        assert watchdog_interval(env) is None

    def test_reads_the_process_environment_by_default(self, monkeypatch) -> None:
        monkeypatch.setenv("WATCHDOG_USEC", "2500000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        assert watchdog_interval() == 2.5


class Counter:
    """Stands in for the engine loop's iteration counter."""

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1

    def __call__(self) -> int:
        return self.value


class TestWatchdogPinger:
    def test_pings_only_when_the_counter_advanced(self, receiver: Receiver) -> None:
        counter = Counter()
        pinger = WatchdogPinger(Notifier(), counter, interval=1.0)
        assert not pinger.check()  # baseline
        counter.bump()
        assert pinger.check()
        assert receiver.recv() == "WATCHDOG=1"
        assert not pinger.check() and not pinger.check()  # stalled: no ping
        assert pinger.stalled
        assert receiver.pending() == []
        counter.bump()
        counter.bump()
        assert pinger.check()  # progress again: pings resume
        assert not pinger.stalled
        assert receiver.pending() == ["WATCHDOG=1"]

    def test_stall_is_logged_once(self, receiver: Receiver, caplog) -> None:
        counter = Counter()
        pinger = WatchdogPinger(Notifier(), counter, interval=1.0)
        pinger.check()
        with caplog.at_level(logging.WARNING, logger="nvllm.server.systemd"):
            for _ in range(4):
                pinger.check()
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1

    def test_thread_pings_while_engine_loops_and_stops_when_it_stalls(self, receiver: Receiver) -> None:
        counter = Counter()
        pinger = WatchdogPinger(Notifier(), counter, interval=0.01)
        pinger.start()
        try:
            pings = 0
            deadline = time.monotonic() + WAIT_S
            while pings < 3:  # the "engine" loops: every wait for a ping finds one
                assert time.monotonic() < deadline, "no pings while the counter advanced"
                counter.bump()
                receiver.sock.settimeout(0.05)
                try:
                    assert receiver.sock.recv(64) == b"WATCHDOG=1"
                    pings += 1
                except TimeoutError:
                    pass
            # The engine hangs: after two more checks no ping may follow, however many checks come.
            checks = pinger.num_checks
            wait_until(lambda: pinger.num_checks >= checks + 2)
            receiver.pending()
            sent = pinger.num_pings
            checks = pinger.num_checks
            wait_until(lambda: pinger.num_checks >= checks + 5)
            assert receiver.pending() == []
            assert pinger.num_pings == sent and pinger.stalled
        finally:
            pinger.stop()

    def test_from_env_pings_at_half_the_watchdog_timeout(self, receiver: Receiver, monkeypatch) -> None:
        monkeypatch.setenv("WATCHDOG_USEC", "30000000")
        pinger = WatchdogPinger.from_env(Notifier(), Counter())
        assert pinger is not None and pinger.interval == 15.0

    def test_from_env_is_none_without_watchdog_or_socket(self, receiver: Receiver, monkeypatch) -> None:
        assert WatchdogPinger.from_env(Notifier(), Counter()) is None
        monkeypatch.setenv("WATCHDOG_USEC", "30000000")
        monkeypatch.delenv("NOTIFY_SOCKET")
        assert WatchdogPinger.from_env(Notifier(), Counter()) is None

    def test_stop_ends_the_thread(self, receiver: Receiver) -> None:
        pinger = WatchdogPinger(Notifier(), Counter(), interval=0.01)
        pinger.start()
        pinger.stop()
        assert not any(t.name == "nvllm-watchdog" for t in threading.enumerate())


# ---------------------------------------------------------------------------------------------- logs


@pytest.fixture
def log_file(tmp_path: Path, monkeypatch) -> Iterator[tuple[Path, object]]:
    """A real file as the log stream (so JOURNAL_STREAM can name its device and inode)."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    path = tmp_path / "out.log"
    root = logging.getLogger()
    level = root.level
    with open(path, "w") as stream:
        yield path, stream
        for h in [h for h in root.handlers if isinstance(h, logs._Handler)]:
            root.removeHandler(h)
        root.setLevel(level)
        logging.captureWarnings(False)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def journal_stream_of(stream) -> str:
    st = os.fstat(stream.fileno())
    return f"{st.st_dev}:{st.st_ino}"


class TestLogs:
    def test_plain_lines_without_journal_stream(self, log_file) -> None:
        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        logging.getLogger("nvllm.test").info("hello %s", "world")
        logging.getLogger("nvllm.test").warning("careful")
        assert lines(path) == ["INFO nvllm.test: hello world", "WARNING nvllm.test: careful"]

    def test_priority_prefixes_when_stdout_is_the_journal(self, log_file, monkeypatch) -> None:
        path, stream = log_file
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream_of(stream))
        logs.setup_logging("debug", stream=stream)
        log = logging.getLogger("nvllm.test")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        log.critical("c")
        assert lines(path) == ["<7>nvllm.test: d", "<6>nvllm.test: i", "<4>nvllm.test: w",
                               "<3>nvllm.test: e", "<2>nvllm.test: c"]

    def test_journal_stream_of_another_file_means_plain(self, log_file, monkeypatch) -> None:
        path, stream = log_file
        monkeypatch.setenv("JOURNAL_STREAM", "1:2")
        logs.setup_logging("info", stream=stream)
        logging.getLogger("nvllm.test").info("x")
        assert lines(path) == ["INFO nvllm.test: x"]

    def test_level_filters(self, log_file) -> None:
        path, stream = log_file
        logs.setup_logging("warning", stream=stream)
        logging.getLogger("nvllm.test").info("dropped")
        logging.getLogger("nvllm.test").error("kept")
        assert lines(path) == ["ERROR nvllm.test: kept"]

    def test_unknown_level_is_refused(self) -> None:
        with pytest.raises(ValueError, match="log level"):
            logs.setup_logging("verbose")

    def test_a_request_id_given_with_the_record_is_on_its_line(self, log_file) -> None:
        # How the engine thread, outside any request's context, names the request a line is about.
        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        log = logging.getLogger("nvllm.engine")
        log.info("admitted", extra={"request_id": "req-7f3a"})
        with logs.request_context("other"):
            log.info("finished", extra={"request_id": "req-7f3a"})
        log.info("idle")
        assert lines(path) == ["INFO nvllm.engine [request_id=req-7f3a]: admitted",
                               "INFO nvllm.engine [request_id=req-7f3a]: finished",
                               "INFO nvllm.engine: idle"]

    def test_request_context_follows_tasks(self, log_file) -> None:
        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        log = logging.getLogger("nvllm.server.service")

        async def handle(rid: str) -> None:
            with logs.request_context(rid):
                await asyncio.sleep(0)
                await asyncio.create_task(asyncio.sleep(0))
                log.info("streaming")
                await asyncio.get_running_loop().create_task(child())

        async def child() -> None:
            log.info("child task")

        async def main() -> None:
            await asyncio.gather(handle("a1"), handle("b2"))

        asyncio.run(main())
        log.info("outside")
        got = lines(path)
        assert sorted(got[:4]) == sorted([
            "INFO nvllm.server.service [request_id=a1]: streaming",
            "INFO nvllm.server.service [request_id=a1]: child task",
            "INFO nvllm.server.service [request_id=b2]: streaming",
            "INFO nvllm.server.service [request_id=b2]: child task"])
        assert got[4] == "INFO nvllm.server.service: outside"
        log.info("after")
        assert lines(path)[-1] == "INFO nvllm.server.service: after"

    def test_exception_is_folded_into_one_line(self, log_file, monkeypatch) -> None:
        path, stream = log_file
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream_of(stream))
        logs.setup_logging("info", stream=stream)
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logging.getLogger("nvllm.engine").exception("step failed", extra={"request_id": "r9"})
        (line,) = lines(path)
        assert line.startswith("<3>nvllm.engine [request_id=r9]: step failed | Traceback (most recent call last):")
        assert "ValueError: boom | second line" in line

    def test_multiline_message_is_folded(self, log_file) -> None:
        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        logging.getLogger("nvllm.test").info("prompt:\nhello\n\nworld")
        assert lines(path) == ["INFO nvllm.test: prompt: | hello | world"]

    def test_warnings_are_logged(self, log_file) -> None:
        import warnings

        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        warnings.warn("old flag", UserWarning, stacklevel=1)
        (line,) = lines(path)
        assert line.startswith("WARNING py.warnings: ") and "old flag" in line

    def test_setup_twice_keeps_one_handler(self, log_file) -> None:
        path, stream = log_file
        logs.setup_logging("info", stream=stream)
        logs.setup_logging("info", stream=stream)
        logging.getLogger("nvllm.test").info("once")
        assert lines(path) == ["INFO nvllm.test: once"]

    def test_an_announced_line_is_never_split_by_a_log_line_from_another_thread(self, log_file) -> None:
        # The test daemons run with PYTHONUNBUFFERED: print() wrote the address and its newline apart, and
        # a warning from the prefix-store thread once landed between them ("...:33023WARNING ...").
        path, stream = log_file

        class EveryWriteApart(io.TextIOWrapper):
            def write(self, s: str) -> int:
                n = super().write(s)
                self.flush()
                time.sleep(0)             # let the other thread in between any two writes
                return n

        with open(path, "wb") as raw:
            out = EveryWriteApart(raw, encoding="utf-8")
            logs.setup_logging("info", stream=out)
            log = logging.getLogger("nvllm.engine.warm.prefix_store")

            def warn() -> None:
                for i in range(300):
                    log.warning("damaged %d", i)

            logger = threading.Thread(target=warn)
            logger.start()
            for i in range(300):
                logs.announce(f"nvllm serving m on 127.0.0.1:{i}", stream=out)
            logger.join()
            out.flush()
        got = lines(path)
        assert sorted(got) == sorted([f"WARNING nvllm.engine.warm.prefix_store: damaged {i}" for i in range(300)]
                                     + [f"nvllm serving m on 127.0.0.1:{i}" for i in range(300)])
