"""The listener: a loopback or TLS TCP port, or a unix socket created with a private mode.

A unix socket is created with mode server.unix_socket_mode (never wider, even for an instant: the umask
is tightened while it is made); any other TCP address without TLS is logged as a warning.
server.tls_cert/tls_key turn TLS on; server.tls_client_ca requires client certificates signed by that CA
(mutual TLS), and is refused at start-up without tls_cert/tls_key rather than silently ignored.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import stat
from pathlib import Path

import grpc

from nvllm.config import Settings

log = logging.getLogger("nvllm.server.listen")

EXIT_FAILURE, EXIT_CONFIG = 1, 2


class ListenError(Exception):
    """The listener cannot be opened; `code` is the exit status (2: a setting to change)."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def unix_path(listen: str) -> str | None:
    if not listen.startswith("unix:"):
        return None
    rest = listen[len("unix:"):]
    return rest[2:] if rest.startswith("//") else rest


def check_unix_socket(path: str) -> None:
    """Refuse a socket another process serves; remove a stale one."""
    p = Path(path)
    if not p.exists():
        if not p.parent.is_dir():
            raise ListenError(f"cannot listen on unix:{path}: directory {p.parent} does not exist")
        return
    if not stat.S_ISSOCK(p.stat().st_mode):
        raise ListenError(f"cannot listen on unix:{path}: the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        p.unlink()   # stale: nobody accepts on it
        return
    finally:
        probe.close()
    raise ListenError(f"cannot listen on unix:{path}: another process is serving on it", EXIT_FAILURE)


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    s = settings.server
    if not (s.tls_cert or s.tls_key):
        if s.tls_client_ca:
            raise ListenError("server.tls_client_ca (mutual TLS) needs server.tls_cert and server.tls_key: "
                               "without them the daemon would serve in plain text")
        return None
    if not (s.tls_cert and s.tls_key):
        raise ListenError("server.tls_cert and server.tls_key must be set together")
    try:
        key, cert = Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes()
        ca = Path(s.tls_client_ca).read_bytes() if s.tls_client_ca else None
    except OSError as e:
        raise ListenError(f"cannot read TLS files: {e}") from e
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None   # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def bind(server: grpc.aio.Server, settings: Settings) -> str:
    """Open the listener; returns the address as clients should dial it."""
    listen = settings.server.listen
    path = unix_path(listen)
    if path is not None:
        check_unix_socket(path)
    creds = server_credentials(settings)
    if path is None and creds is None and not is_loopback(listen.rsplit(":", 1)[0]):
        log.warning("listening on %s without TLS: any host that reaches it can use the model and read "
                    "the prompts (set server.tls_cert/tls_key, or listen on loopback or a unix socket)", listen)
    # A unix socket is born with the umask's mode: keep it private until chmod sets the configured one.
    old_umask = os.umask(0o177) if path is not None else None
    try:
        port = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    except RuntimeError as e:
        why = "is the port already in use?" if path is None else str(e)
        raise ListenError(f"cannot listen on {listen}: {why} (set server.listen or --listen)",
                           EXIT_FAILURE) from None
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if path is not None:
        os.chmod(path, settings.server.unix_socket_mode)
        return f"unix:{path}"
    host = listen.rsplit(":", 1)[0]
    return f"{host}:{port}"
