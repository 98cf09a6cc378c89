"""The HTTP listener: a TCP socket bound at start-up (a taken port fails at once, as gRPC's does), served
by uvicorn as a task on the daemon's own asyncio loop, beside grpc.aio.

uvicorn's signal handling is switched off: the daemon owns SIGTERM/SIGINT and the drain. Off loopback the
listener refuses to start with neither TLS nor an API key. uvicorn runs on h11 (pure Python), so nothing
needs building on the board.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from nvllm.config import HttpSettings
from nvllm.server.http.auth import KeyFileError, read_api_key
from nvllm.server.listen import EXIT_FAILURE, ListenError, is_loopback

log = logging.getLogger("nvllm.server.http")

# How long an idle connection is kept open. Longer than the clients' own expiry (httpx's, the openai and
# ollama clients', is 5 s; uvicorn's default is also 5 s): with both at 5 s a client may send on a connection
# the server is closing that very moment, and the request fails with a read error.
KEEP_ALIVE_S = 30


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield          # the daemon's loop handles the signals (and drains); uvicorn must not take them


def split_host_port(listen: str, setting: str) -> tuple[str, int]:
    """"127.0.0.1:8000" -> ("127.0.0.1", 8000); "[::1]:8000" -> ("::1", 8000)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ListenError(f"{setting} must be host:port (e.g. 127.0.0.1:8000), got {listen!r}")
    return host.strip("[]"), int(port)


def http_api_key(settings: HttpSettings) -> bytes | None:
    if not settings.api_key_file:
        return None
    try:
        return read_api_key(settings.api_key_file)
    except KeyFileError as e:
        raise ListenError(str(e)) from None


def check_security(settings: HttpSettings, setting: str = "http.listen") -> bool:
    """Whether TLS is on; ListenError for a half-set TLS pair, or a non-loopback address with neither
    TLS nor an API key."""
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ListenError("http.tls_cert and http.tls_key must be set together")
    tls = bool(settings.tls_cert)
    host, _ = split_host_port(settings.listen, setting)
    if not is_loopback(host) and not tls and not settings.api_key_file:
        raise ListenError(f"refusing to serve HTTP on {settings.listen} without TLS or an API key: any host "
                          "that reaches it could use the model and read the prompts (set http.tls_cert and "
                          "http.tls_key, or http.api_key_file, or listen on 127.0.0.1)")
    if not is_loopback(host) and not tls:
        log.warning("HTTP on %s without TLS: the API key and the prompts cross the network in clear", settings.listen)
    return tls


def bind_socket(listen: str, setting: str) -> socket.socket:
    host, port = split_host_port(listen, setting)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ListenError(f"cannot listen on {listen} ({setting}): {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {listen}: {e.strerror} (set {setting})", EXIT_FAILURE) from None
    sock.setblocking(False)
    return sock


class HttpListener:
    """One uvicorn server on one bound socket; `address` is what clients dial (http[s]://host:port)."""

    def __init__(self, app: Any, listen: str, setting: str, tls_cert: str = "", tls_key: str = "",
                 graceful_s: float = 5.0) -> None:
        self.sock = bind_socket(listen, setting)
        host = listen.rpartition(":")[0]
        port = self.sock.getsockname()[1]
        self.address = f"{'https' if tls_cert else 'http'}://{host}:{port}"
        # uvicorn annotates the grace as int but hands it to asyncio.wait_for, which takes float seconds.
        self.config = uvicorn.Config(app, http="h11", ws="none", lifespan="off", log_config=None,
                                     access_log=False, server_header=False, ssl_certfile=tls_cert or None,
                                     ssl_keyfile=tls_key or None,
                                     timeout_keep_alive=KEEP_ALIVE_S,
                                     timeout_graceful_shutdown=graceful_s)  # type: ignore[arg-type]
        if tls_cert:
            try:   # read the TLS files now, so a bad one fails start-up in a second (uvicorn reads them again)
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls_cert, tls_key)
            except (OSError, ssl.SSLError) as e:
                self.sock.close()
                raise ListenError(f"cannot read the HTTP TLS files (http.tls_cert, http.tls_key): {e}") from None
        self.server = _Server(self.config)
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            if self.task.done():
                self.task.result()      # raises what stopped it
                raise ListenError(f"the HTTP server on {self.address} stopped at start-up", EXIT_FAILURE)
            await asyncio.sleep(0.01)

    async def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and the idle connections; open responses get uvicorn's grace to finish."""
        if self.task is None:
            self.sock.close()
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except asyncio.TimeoutError:
            self.server.force_exit = True
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        self.task = None
