"""The [[upstreams]] tables of the settings (config.py's Settings.upstreams): bigger OpenAI-compatible servers
that answer what the board would refuse (server/upstream/; docs/api.md "Forwarding to a bigger server").
deploy/nvllm.toml documents each field."""

from __future__ import annotations

from dataclasses import dataclass, field

from nvllm.config_values import NON_EMPTY, ConfigError, above, show

# Why a request goes upstream ([[upstreams]] forward_when): the model is not served here, the prompt is
# longer than the local context, the memory plan or the queue refuses it, or the board is hot.
FORWARD_REASONS = ("not_served", "too_long", "no_room", "busy", "hot")


@dataclass
class UpstreamPolicy:
    """One [[upstreams.policy]] table: a model's own forward_when, in place of its upstream's."""
    model: str = field(default="", metadata=NON_EMPTY)
    forward_when: list[str] = field(default_factory=list)


@dataclass
class UpstreamEntry:
    """One [[upstreams]] table."""
    name: str = field(default="", metadata=NON_EMPTY)
    # Where its /v1/chat/completions and /v1/completions are: http://HOST:PORT or http://HOST:PORT/v1 alike.
    base_url: str = field(default="", metadata=NON_EMPTY)
    # Sent as "Authorization: Bearer KEY"; or read from a file (its first line), kept out of the config.
    api_key: str = ""
    api_key_file: str = ""
    # The model names it serves ("*": any), matched against the name the request gives.
    models: list[str] = field(default_factory=lambda: ["*"])
    # Bounds the connection and every wait for bytes (the first byte of a whole answer included).
    timeout_s: float = field(default=10.0, metadata=above(0.0))
    # When to forward: any of FORWARD_REASONS ("hot" is off unless named).
    forward_when: list[str] = field(default_factory=lambda: ["not_served", "too_long", "no_room", "busy"])
    # A model's own forward_when ([[upstreams.policy]] tables).
    policy: list[UpstreamPolicy] = field(default_factory=list)


def check_upstreams(upstreams: list[UpstreamEntry]) -> None:
    """What spans fields: names unique, a base URL of HTTP, one key, known reasons; ConfigError otherwise."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    names = [u.name for u in upstreams]
    need(len(names) == len(set(names)), f"upstreams: two [[upstreams]] share a name: {sorted(names)}")
    for i, u in enumerate(upstreams):
        need(u.base_url.startswith(("http://", "https://")),
             f"upstreams[{i}].base_url must start with http:// or https://, got {show(u.base_url)}")
        need(not (u.api_key and u.api_key_file), f"upstreams[{i}]: give api_key or api_key_file, not both")
        for where, reasons in [("forward_when", u.forward_when)] + \
                [(f"policy[{j}].forward_when", p.forward_when) for j, p in enumerate(u.policy)]:
            bad = [r for r in reasons if r not in FORWARD_REASONS]
            need(not bad, f"upstreams[{i}].{where}: {', '.join(map(show, bad))} is not one of "
                 f"{', '.join(FORWARD_REASONS)}")
