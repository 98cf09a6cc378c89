"""Every setting in one place: dataclasses with defaults, read from a TOML file, overridden by flags.

deploy/nvllm.toml documents each field; the section names there are the dataclass names here.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # JetPack 6 ships Python 3.10
    import tomli as tomllib

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class ModelSettings:
    # A Hugging Face folder, or the name of a model under models_dir.
    path: str = DEFAULT_MODEL
    models_dir: str = "models"
    # The name clients may send in GenerateRequest.model; the folder's name when empty.
    served_name: str = ""
    # BLAS threads for the matmuls; 0 = one per core but one, left to the gRPC loop and the board's
    # other work (OpenBLAS threads that outnumber free cores slow every matmul several-fold).
    blas_threads: int = 0


@dataclass
class CacheSettings:
    block_size: int = 16
    # An explicit page count overrides all sizing below.
    num_blocks: int | None = None
    # Share of the available memory (after the weights load) the page pool may take.
    memory_fraction: float = 0.5
    # Memory left to everything else on the board, taken off before the fraction applies.
    reserve_mb: int = 1024
    # Upper bound on the pool, whatever memory is available; 0 means none.
    max_pool_mb: int = 2048
    enable_prefix_caching: bool = True


@dataclass
class SchedulerSettings:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    # Context length a sequence may reach; the model's own limit when None.
    max_model_len: int | None = 4096
    # Requests waiting for a running slot; beyond it new ones are refused.
    max_waiting: int = 64


@dataclass
class ServerSettings:
    # host:port, or unix:/path/to/socket
    listen: str = "127.0.0.1:50051"
    unix_socket_mode: int = 0o660
    max_message_bytes: int = 1 << 20
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    max_streams_per_client: int = 64
    # Seconds running requests get to finish after SIGTERM before they are cancelled.
    drain_grace_s: float = 30.0
    tls_cert: str = ""
    tls_key: str = ""
    # When set, clients must present a certificate signed by this CA (mutual TLS).
    tls_client_ca: str = ""


@dataclass
class WatchdogSettings:
    interval_s: float = 1.0
    # Below low_mb available, new requests are refused; admission resumes above high_mb.
    low_mb: int = 256
    high_mb: int = 512


@dataclass
class Settings:
    model: ModelSettings = field(default_factory=ModelSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    log_level: str = "info"

    def model_dir(self) -> Path:
        """The model folder: a path as given, else a name under models_dir."""
        p = Path(self.model.path)
        if p.is_dir() or p.is_absolute() or len(p.parts) > 1:
            return p
        return Path(self.model.models_dir) / p


class ConfigError(ValueError):
    pass


def _apply(obj: Any, values: dict[str, Any], where: str) -> None:
    names = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {', '.join(sorted(names))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{key}: expected a table, got {value!r}")
            _apply(current, value, f"{where}.{key}")
            continue
        if value is not None and current is not None and not isinstance(value, type(current)):
            ok = isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool)
            if not ok:
                raise ConfigError(
                    f"{where}.{key}: expected {type(current).__name__}, got {value!r}")
            value = float(value)
        setattr(obj, key, value)


def load_settings(path: str | Path | None = None,
                  overrides: dict[str, dict[str, Any]] | None = None) -> Settings:
    """Defaults, then the TOML file, then overrides such as {"model": {"path": "..."}}."""
    settings = Settings()
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from None
        _apply(settings, data, str(path))
    if overrides:
        clean = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in overrides.items()}
        _apply(settings, clean, "flags")
    validate(settings)
    return settings


def validate(s: Settings) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(s.model.blas_threads >= 0, f"model.blas_threads must be >= 0 (0 = automatic), got {s.model.blas_threads}")
    need(s.cache.block_size in (8, 16, 32, 64, 128), f"cache.block_size must be 8, 16, 32, 64 or 128, got {s.cache.block_size}")
    need(s.cache.num_blocks is None or s.cache.num_blocks > 0, f"cache.num_blocks must be positive, got {s.cache.num_blocks}")
    need(0.0 < s.cache.memory_fraction <= 0.95, f"cache.memory_fraction must be in (0, 0.95], got {s.cache.memory_fraction}")
    need(s.cache.reserve_mb >= 0 and s.cache.max_pool_mb >= 0, "cache.reserve_mb and cache.max_pool_mb must not be negative")
    need(s.scheduler.max_num_seqs >= 1, f"scheduler.max_num_seqs must be >= 1, got {s.scheduler.max_num_seqs}")
    need(s.scheduler.max_num_batched_tokens >= s.cache.block_size,
         f"scheduler.max_num_batched_tokens must be >= cache.block_size ({s.cache.block_size}), got {s.scheduler.max_num_batched_tokens}")
    need(s.scheduler.max_model_len is None or s.scheduler.max_model_len >= 2,
         f"scheduler.max_model_len must be >= 2, got {s.scheduler.max_model_len}")
    need(s.scheduler.max_waiting >= 0, f"scheduler.max_waiting must not be negative, got {s.scheduler.max_waiting}")
    need(s.watchdog.interval_s > 0, f"watchdog.interval_s must be positive, got {s.watchdog.interval_s}")
    need(0 <= s.watchdog.low_mb <= s.watchdog.high_mb,
         f"watchdog.low_mb ({s.watchdog.low_mb}) must be between 0 and watchdog.high_mb ({s.watchdog.high_mb})")
    need(s.server.drain_grace_s >= 0, f"server.drain_grace_s must not be negative, got {s.server.drain_grace_s}")
    need(s.server.max_streams_per_client >= 0,
         f"server.max_streams_per_client must not be negative (0: no limit), got {s.server.max_streams_per_client}")
    need(s.server.max_message_bytes >= 1024, f"server.max_message_bytes must be >= 1024, got {s.server.max_message_bytes}")
    need(s.log_level in ("debug", "info", "warning", "error"), f"log_level must be debug, info, warning or error, got {s.log_level!r}")
