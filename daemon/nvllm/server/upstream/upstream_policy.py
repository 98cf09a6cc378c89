"""[[upstreams]] settings as routes: for a request's model and the reason it would be refused here, the first
upstream that serves that model and forwards for that reason (its model's policy, else its forward_when)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvllm.config_upstreams import UpstreamEntry
from nvllm.config_values import ConfigError


@dataclass(frozen=True)
class Upstream:
    """One upstream as the client speaks to it."""
    name: str
    base_url: str           # without a trailing "/v1": the paths are added whole
    api_key: str
    models: tuple[str, ...]
    timeout_s: float
    forward_when: frozenset[str]
    by_model: dict[str, frozenset[str]] = field(default_factory=dict, hash=False, compare=False)

    def url(self, path: str) -> str:
        """path: "/v1/chat/completions" or "/v1/completions"."""
        return self.base_url + path

    def serves(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    def forwards(self, model: str, reason: str) -> bool:
        return reason in self.by_model.get(model, self.forward_when)

    @property
    def answered_by(self) -> str:
        """What the response says about where it was answered."""
        return f"upstream:{self.name}"


def upstream_from(entry: UpstreamEntry) -> Upstream:
    """An [[upstreams]] table read: its key (api_key_file's first line), its base URL without "/v1"."""
    key = entry.api_key
    if entry.api_key_file:
        try:
            lines = Path(entry.api_key_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"upstreams {entry.name}: api_key_file {entry.api_key_file}: "
                              f"{getattr(e, 'strerror', None) or e}") from None
        key = lines[0].strip() if lines else ""
    base = entry.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return Upstream(entry.name, base, key, tuple(entry.models), entry.timeout_s, frozenset(entry.forward_when),
                    {p.model: frozenset(p.forward_when) for p in entry.policy})


class UpstreamRoutes:
    """Which upstream answers a request refused here."""

    def __init__(self, upstreams: Iterable[Upstream]) -> None:
        self.upstreams = list(upstreams)

    @classmethod
    def from_settings(cls, entries: Iterable[UpstreamEntry]) -> UpstreamRoutes:
        return cls(upstream_from(e) for e in entries)

    def __bool__(self) -> bool:
        return bool(self.upstreams)

    def route(self, names: Sequence[str], reason: str) -> Upstream | None:
        """The first upstream that serves one of names (the name as asked, then the served name it resolves
        to) and forwards it for reason; None: refuse here."""
        for u in self.upstreams:
            for name in names:
                if name and u.serves(name) and u.forwards(name, reason):
                    return u
        return None

    def forwards_for(self, reason: str) -> bool:
        """Whether any upstream forwards anything for reason (so the front door need not look further)."""
        return any(reason in u.forward_when or any(reason in r for r in u.by_model.values())
                   for u in self.upstreams)
