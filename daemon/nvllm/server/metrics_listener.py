"""The metrics-only listener: GET /metrics over plain HTTP on metrics.listen (host:port).

The standard library's threading HTTP server, in threads of its own: a scrape never waits for the
event loop or the engine thread (it reads the engine's stats snapshot). It answers GET and HEAD on
/metrics (and /, for a browser), 404 elsewhere, always in text format 0.0.4 (Metrics.exposition says
why not prometheus_client's own server, which would negotiate OpenMetrics).

It has no TLS and no authentication: metrics carry no prompts and no keys, only the model's name,
load and timings, so it may listen off loopback for a Prometheus on another host (the log line says
so); keep it on a private interface. The HTTP API, when on, serves the same at /metrics too.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nvllm.server.listen import EXIT_CONFIG, EXIT_FAILURE, ListenError, is_loopback

log = logging.getLogger("nvllm.server.metrics")

SETTING = "metrics.listen"
PATHS = ("/metrics", "/")

Exposition = Callable[[], "tuple[bytes, str]"]


def parse_host_port(listen: str, setting: str = SETTING) -> tuple[str, int]:
    """("127.0.0.1", 9400) from "127.0.0.1:9400" ("[::1]:9400" gives "::1"); ListenError naming the
    setting otherwise."""
    host, sep, port = listen.rpartition(":")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(f"{setting} must be host:port with a port in [0, 65535] "
                          f"(e.g. 127.0.0.1:9400), got {listen!r}", EXIT_CONFIG)
    return host, int(port)


class _Handler(BaseHTTPRequestHandler):
    exposition: Exposition      # set on the per-listener subclass
    server_version = "nvllm-metrics"

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        if self.path.split("?", 1)[0] not in PATHS:
            body, content_type, status = b"not found: metrics are at /metrics\n", "text/plain; charset=utf-8", 404
        else:
            try:
                body, content_type = type(self).exposition()
                status = 200
            except Exception:   # a collector failed: answer 500, keep serving
                log.exception("metrics: a scrape failed")
                body, content_type, status = b"metrics failed; see the daemon's log\n", "text/plain; charset=utf-8", 500
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass   # a scrape every few seconds would flood the journal


class MetricsListener:
    """Serves exposition() on `listen` once started; `address` is then host:port with the real port."""

    def __init__(self, listen: str, exposition: Exposition) -> None:
        self.listen = listen
        self.host, self.port = parse_host_port(listen)
        self.handler = type("MetricsHandler", (_Handler,), {"exposition": staticmethod(exposition)})
        self.address = ""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Bind and serve; ListenError (exit 1 for a port in use, 2 for an address that is wrong)."""
        try:
            family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
            server_class = type("MetricsServer", (ThreadingHTTPServer,), {"address_family": family})
            self._server = server_class((self.host, self.port), self.handler)
        except socket.gaierror as e:
            raise ListenError(f"cannot serve metrics on {self.listen}: unknown host {self.host!r} "
                              f"({e.strerror}) (set {SETTING})", EXIT_CONFIG) from None
        except OSError as e:
            raise ListenError(f"cannot serve metrics on {self.listen}: {e.strerror or e} "
                              f"(is the port already in use? set {SETTING})", EXIT_FAILURE) from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="nvllm-metrics", daemon=True)
        self._thread.start()
        port = self._server.server_address[1]
        self.address = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        if is_loopback(self.host):
            log.info("metrics on http://%s/metrics", self.address)
        else:
            log.info("metrics on http://%s/metrics, reachable off this host: no authentication (metrics "
                     "carry no prompts, but show the model and its load)", self.address)
        return self.address

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice or before start."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
