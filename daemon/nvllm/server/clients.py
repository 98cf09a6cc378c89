"""Whom a call counts against (server.max_streams_per_client): a peer's address as one client.

Streams per client are counted by the peer's address: the IP without the port for TCP (one host is
one client, however many connections it opens); every unix-socket peer shares the key "unix" (gRPC
does not report the peer's uid/pid), so on a unix socket the limit bounds all local clients together.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote


def client_key(peer: str) -> str:
    """Whom a call counts against: "ipv4:10.0.0.7:51234" -> "10.0.0.7", "ipv6:[::1]:51234" -> "::1",
    "ipv6:[::ffff:10.0.0.7]:51234" (IPv4 on a dual-stack socket) -> "10.0.0.7"; unix peers -> "unix"."""
    scheme, _, rest = unquote(peer).partition(":")
    if scheme in ("unix", "unix-abstract"):
        return "unix"
    if scheme not in ("ipv4", "ipv6"):
        return peer
    return host_key(rest.rsplit(":", 1)[0].strip("[]"))


def host_key(host: str) -> str:
    """An address as one client: an IPv4-mapped IPv6 address (IPv4 on a dual-stack socket) as IPv4."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)

