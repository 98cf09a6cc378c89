"""Every setting in one place: dataclasses with defaults, read from a TOML file, overridden by flags.

deploy/nvllm.toml documents each field; the section names there are the dataclass names here.
Each field's annotation is its type and its metadata (at_least, above, between, one_of, NON_EMPTY, from
config_values.py) its allowed values: load_settings checks every value against both, so a new field is
checked as soon as it is declared. validate() adds the checks that span fields.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvllm.config_upstreams import UpstreamEntry, check_upstreams
from nvllm.config_values import (
    DURATION,
    DURATION_OR_EMPTY,
    NON_EMPTY,
    ConfigError,
    above,
    at_least,
    between,
    checked,
    one_of,
    show,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # JetPack 6 ships Python 3.10
    import tomli as tomllib

log = logging.getLogger("nvllm.config")

DEFAULT_MODEL = "smollm2-135m-instruct"          # the registry's name (`nvllm models pull`)
DEFAULT_MODEL_FILE = DEFAULT_MODEL + ".gguf"      # what is served by default: the pulled GGUF, as shipped

# Settings that were renamed: the old dotted key -> the field's name now. A file or flag that uses the
# old name still works, with a warning; giving both names is refused.
RENAMED = {"model.blas_threads": "threads"}


@dataclass
class ModelSettings:
    # A Hugging Face folder or a .gguf file, or the name of either under models_dir.
    path: str = field(default=DEFAULT_MODEL_FILE, metadata=NON_EMPTY)
    models_dir: str = "models"
    # The name clients may send in GenerateRequest.model; when empty, the folder's name or the GGUF
    # file's without .gguf.
    served_name: str = ""
    # Threads for the matmuls, BLAS's and the in-place kernels' alike; 0 = one per core this process may
    # use (affinity and cgroup CPU quota) but one, left to the gRPC loop and the board's other work
    # (threads that outnumber free cores slow every matmul several-fold). Formerly blas_threads.
    threads: int = field(default=0, metadata=at_least(0))
    # Pin the C kernels' pool threads to cores, thread i to the i-th CPU this process may use (the engine's
    # own thread, which joins every team, to the first): no migrations mid-step, at the cost of sharing a
    # core badly with whatever else the scheduler would have moved.
    pin_threads: bool = False
    # The weights' format in memory: "" keeps the file's (a folder's bfloat16/float16 matrices stay 16-bit,
    # exactly); f32 widens a folder's to float32; q8_0, q4_0, q4_k, bf16 or f16 re-quantize a folder's
    # matrices at load as llama.cpp would (a matrix whose rows do not split into the format's blocks
    # falls back: q4_k -> q8_0 -> float32). A GGUF always keeps its formats.
    quantization: str = field(default="", metadata=one_of("", "f32", "q8_0", "q4_0", "q4_k", "bf16", "f16"))
    # How a quantized weight meets x: "exact" (the default) rounds x to 16 bits per block of 32, held as two
    # 8-bit planes (its top-1 tokens and greedy answers are the float product's: 98% of 64 chat prompts'
    # 16-token answers on SmolLM2, against 56% for int8, `nvllm bench --quality`); "int8" to 8 bits, as
    # llama.cpp does (faster where a step is bound by arithmetic: prefill and many streams; docs/models.md
    # has both tables); "float" decodes the weights and multiplies in float32 (the reference, slowest).
    # One setting per process.
    activations: str = field(default="exact", metadata=one_of("exact", "int8", "float"))
    # What the model serves: "auto" reads it from its files (an encoder with a classifier head reranks,
    # one without embeds, a decoder generates); another value must agree with them.
    task: str = field(default="auto", metadata=one_of("auto", "generate", "embed", "rerank"))
    # How long a model stays loaded after its last request (Ollama's keep_alive): "5m", "30s", "1h", a
    # number of seconds, 0 (unloaded right after) or -1 (never); every model's default ([[models]] and
    # each request may set their own). A pinned model is loaded at start and never unloaded.
    keep_alive: str = field(default="5m", metadata=DURATION)
    pinned: bool = False
    # Serve every .gguf file and model folder in this folder besides the models named (`serve
    # --models-dir DIR`), each under its file's name without .gguf or its folder's name.
    serve_dir: str = ""


@dataclass
class ModelEntry:
    """One [[models]] table: a model served by name. Settings left out are the [model], [cache] and
    [scheduler] ones."""
    # A Hugging Face folder or a .gguf file, or the name of either under model.models_dir; or, instead, source:
    path: str = ""
    # A model of the Hugging Face Hub (ORG/REPO, ORG/REPO:QUANT, ORG/REPO/FILE.gguf, hf.co/ORG/REPO:QUANT),
    # pulled into model.models_dir at start when it is not there yet (`nvllm models pull` pulls the same).
    source: str = ""
    # What requests call it (empty: the file's name without .gguf, or the folder's).
    name: str = ""
    task: str = field(default="", metadata=one_of("", "auto", "generate", "embed", "rerank"))
    keep_alive: str = field(default="", metadata=DURATION_OR_EMPTY)
    pinned: bool = False
    max_model_len: int | None = field(default=None, metadata=at_least(2))
    kv_cache_dtype: str = field(default="", metadata=one_of("", "auto", "f32", "f16", "bf16", "q8_0"))
    threads: int | None = field(default=None, metadata=at_least(0))


@dataclass
class CacheSettings:
    block_size: int = field(default=16, metadata=one_of(8, 16, 32, 64, 128))
    # An explicit page count overrides all sizing below.
    num_blocks: int | None = field(default=None, metadata=at_least(1))
    # Share of the available memory (after the weights load) the page pool may take.
    memory_fraction: float = field(default=0.5, metadata=between(0.0, 0.95, lo_open=True))
    # Memory left to everything else on the board, taken off before the fraction applies.
    reserve_mb: int = field(default=1024, metadata=at_least(0))
    # Upper bound on the pool, whatever memory is available; 0 means none.
    max_pool_mb: int = field(default=2048, metadata=at_least(0))
    # The memory every served model's weights and page pool share (`serve --memory-gb N`); 0: fixed at
    # start from the memory available, less reserve_mb, times memory_fraction.
    budget_gb: float = field(default=0.0, metadata=at_least(0.0))
    enable_prefix_caching: bool = True
    # A model of sliding-window and global layers (Gemma 3) gets a group of pages per kind of layer, and
    # the sliding ones give back the pages behind their window (vLLM's hybrid KV cache manager); false:
    # one group, every page kept (vLLM's --disable-hybrid-kv-cache-manager).
    hybrid_kv_cache: bool = True
    # What the pool stores keys and values in (vLLM's --kv-cache-dtype): auto is f16 for a GGUF (as
    # llama.cpp) and the weights' own float type for a folder; q8_0 is 34 bytes per 32 values.
    dtype: str = field(default="auto", metadata=one_of("auto", "f32", "f16", "bf16", "q8_0"))
    # JSON files, each one prompt ({"prompt": ...}, {"prompt_token_ids": [...]} or {"messages": [...]}),
    # whose full pages are computed at start and never evicted (engine/warm/warmup.py).
    pinned_prompts: list[str] = field(default_factory=list)
    # A directory the pinned and the hottest cached pages are written to at drain and read back at
    # start (engine/warm/prefix_store.py); empty: off.
    persist_dir: str = ""
    # The file in persist_dir holds every pinned page, then the most recently used cached ones while it
    # stays within this many MB.
    persist_max_mb: int = field(default=64, metadata=at_least(0))


@dataclass
class SchedulerSettings:
    # Sequences running at once, and what a model's page pool is planned for (this many of max_model_len,
    # within its share of the memory budget). 4, as llama-server's slots: a board serves a handful of
    # on-board clients (a voice assistant, a planner, a logger), and each model's pool is then a few hundred
    # MiB, not gigabytes; a daemon that batches many streams raises it (`nvllm bench` sets its own).
    max_num_seqs: int = field(default=4, metadata=at_least(1))
    # At least cache.block_size (checked in validate).
    max_num_batched_tokens: int = field(default=512, metadata=at_least(1))
    # Context length a sequence may reach; the model's own limit when None.
    max_model_len: int | None = field(default=4096, metadata=at_least(2))
    # Requests waiting for a running slot; beyond it new ones are refused.
    max_waiting: int = field(default=64, metadata=at_least(0))
    # Steps after which a waiting priority class above 0 ranks one level higher, up to priority 0's level
    # and never above it, so that a low-priority request is not starved by higher ones that keep arriving
    # while an urgent one (priority < 0) still goes first; 0: strict priority.
    priority_aging_steps: int = field(default=256, metadata=at_least(0))


@dataclass
class SpeculativeSettings:
    # "ngram": tokens proposed from the sequence's own prompt and output (vLLM's prompt lookup); "draft":
    # by a smaller model sharing the target's tokenizer (draft_model), greedily; "none": off.
    method: str = field(default="none", metadata=one_of("none", "ngram", "draft"))
    # The draft model for method "draft": a folder or a .gguf, or the name of either under
    # model.models_dir; its vocabulary must be the target's, token for token.
    draft_model: str = ""
    # Tokens proposed per step, all verified in one forward pass (vLLM's num_speculative_tokens).
    num_tokens: int = field(default=4, metadata=between(1, 16))
    # The n-gram that must recur for a proposal: the longest of these lengths that matches is used.
    prompt_lookup_min: int = field(default=2, metadata=between(1, 16))
    prompt_lookup_max: int = field(default=4, metadata=between(1, 16))
    # Off for a step with more running sequences than this (vLLM's disable_by_batch_size): a large
    # batch already reads each weight once for many rows, so extra rows cost more than they save.
    disable_by_batch_size: int = field(default=4, metadata=at_least(1))
    # Verify, of each proposal, only as much as pays by this machine's measured step costs and the
    # sequence's acceptance so far; false: every proposed token, each step.
    adaptive: bool = True


@dataclass
class ServerSettings:
    # host:port, or unix:/path/to/socket
    listen: str = field(default="127.0.0.1:50051", metadata=NON_EMPTY)
    unix_socket_mode: int = field(default=0o660, metadata=between(
        0, 0o777, text="an integer permission mode in [0o000, 0o777] (e.g. 0o660)"))
    # gRPC takes a C int.
    max_message_bytes: int = field(default=1 << 20, metadata=between(1024, 2**31 - 1))
    max_stop_strings: int = field(default=16, metadata=at_least(0))
    max_stop_string_chars: int = field(default=256, metadata=at_least(0))
    # 0: no limit.
    max_streams_per_client: int = field(default=64, metadata=at_least(0))
    # Seconds running requests get to finish after SIGTERM before they are cancelled.
    drain_grace_s: float = field(default=30.0, metadata=at_least(0.0))
    # A model updated in place when the memory budget does not hold both versions: how long new requests wait
    # for the old version's running ones to finish before the update gives up (server/models/model_update.py).
    update_drain_s: float = field(default=60.0, metadata=at_least(0.0))
    tls_cert: str = ""
    tls_key: str = ""
    # When set, clients must present a certificate signed by this CA (mutual TLS).
    tls_client_ca: str = ""
    # Chat answers' thinking (<think>...</think>) sent apart from their content (server/chat/reasoning.py,
    # vLLM's parsers of the same names); empty: the text as the model wrote it.
    reasoning_parser: str = field(default="", metadata=one_of("", "qwen3", "deepseek_r1"))
    # A chat longer than the context: "error" refuses it naming both lengths; "drop_oldest" drops whole
    # turns from the oldest on, keeping the system messages and the last turn. A request's own
    # context_overflow field wins.
    context_overflow: str = field(default="error", metadata=one_of("error", "drop_oldest"))
    # The model a request without a model field gets; empty: the first named (--model, then [[models]]),
    # else the first of model.serve_dir in sorted order.
    default_model: str = ""
    # Speech (server/models/speech_slot.py): the served model that transcribes a chat's audio (the voice
    # query) and a transcription that names no model; empty: the only speech model served.
    speech_model: str = ""
    # An upload to /v1/audio/transcriptions or Transcribe's audio (all its chunks) larger than this is
    # refused (HTTP 413) before it is read further: 25 MiB, OpenAI's limit.
    max_audio_bytes: int = field(default=25 << 20, metadata=between(1024, 2**31 - 1))
    # Audio longer than this many seconds is refused from its header, before it is decoded.
    max_audio_seconds: float = field(default=600.0, metadata=above(0.0))


@dataclass
class HttpSettings:
    # The OpenAI-compatible HTTP API on host:port (e.g. 127.0.0.1:8000); empty: off.
    listen: str = ""
    # The same API again on a second host:port, for Ollama's clients, which dial 11434 (e.g.
    # 127.0.0.1:11434); empty: off. The app is the same (Ollama's /api/* are on `listen` too), as are
    # the key, TLS and the loopback rule below.
    ollama_listen: str = ""
    # A file holding the key clients send as "Authorization: Bearer KEY"; empty: no key. Off loopback
    # the listener needs a key or TLS (or both).
    api_key_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # A larger request body is refused with 413.
    max_body_bytes: int = field(default=1 << 20, metadata=between(1024, 2**31 - 1))


@dataclass
class MetricsSettings:
    # Prometheus metrics on their own HTTP listener, host:port (e.g. 127.0.0.1:9400); empty: off. The
    # HTTP API serves the same metrics at /metrics whatever this says.
    listen: str = ""


@dataclass
class WatchdogSettings:
    interval_s: float = field(default=1.0, metadata=above(0.0))
    # Below low_mb available, new requests are refused; admission resumes above high_mb.
    low_mb: int = field(default=256, metadata=at_least(0))
    high_mb: int = field(default=512, metadata=at_least(0))


@dataclass
class PowerSettings:
    # The board's heat (server/board/heat.py): its CPU zones' temperatures and clock ceilings, read under
    # sysfs_root every interval_s. Throttled at throttle_c degrees Celsius or with a CPU's clock capped,
    # clear below resume_c and uncapped; meanwhile the matmul threads and the step's token budget are cut
    # to these fractions (at least 1 thread and cache.block_size tokens; priority < 0 keeps the budget).
    enabled: bool = True
    sysfs_root: str = field(default="/sys", metadata=NON_EMPTY)
    interval_s: float = field(default=5.0, metadata=above(0.0))
    throttle_c: float = field(default=85.0, metadata=between(0.0, 150.0, lo_open=True))
    resume_c: float = field(default=75.0, metadata=between(0.0, 150.0, lo_open=True))
    throttled_threads: float = field(default=0.5, metadata=between(0.0, 1.0, lo_open=True))
    throttled_budget: float = field(default=0.5, metadata=between(0.0, 1.0, lo_open=True))


@dataclass
class BundleSettings:
    # What `nvllm models import --config FILE` accepts (model_files/bundle_import.py, docs/models.md):
    # public key files (a PEM, or OpenSSH "ssh-ed25519 ..." lines) whose Ed25519 signatures are trusted. A
    # bundle whose signature (FILE.tar.sig) verifies against none of them is refused.
    trusted_keys: list[str] = field(default_factory=list)
    # Refuse an unsigned bundle, before any file of it is written; needs trusted_keys.
    require_signature: bool = False


@dataclass
class Settings:
    model: ModelSettings = field(default_factory=ModelSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    speculative: SpeculativeSettings = field(default_factory=SpeculativeSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    power: PowerSettings = field(default_factory=PowerSettings)
    bundles: BundleSettings = field(default_factory=BundleSettings)
    # The models served by name ([[models]] tables); none: model.path alone (docs/configuration.md).
    models: list[ModelEntry] = field(default_factory=list)
    # Servers that answer what this board refuses ([[upstreams]]); none: nothing forwarded.
    upstreams: list[UpstreamEntry] = field(default_factory=list)
    log_level: str = field(default="info", metadata=one_of("debug", "info", "warning", "error"))

    def model_path(self) -> Path:
        """The model (a folder or a .gguf file): a path as given, else a name under models_dir."""
        p = Path(self.model.path)
        if p.exists() or p.is_absolute() or len(p.parts) > 1:
            return p
        return Path(self.model.models_dir) / p



@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _apply(obj: Any, values: dict[str, Any], source: str, prefix: str = "") -> None:
    """Check each value against its field and set it; source (a file, "flags") prefixes any error."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = _hints(type(obj))   # type: ignore[arg-type]  # mypy takes a class's __hash__ for unbound
    for key, value in values.items():
        name = prefix + key
        if name in RENAMED:
            key = RENAMED[name]
            if key in values:
                raise ConfigError(f"{source}{name} is the old name of {prefix}{key}: give {prefix}{key} alone")
            log.warning("%s%s is deprecated: it is now %s%s (the value %s is used)", source, name, prefix, key,
                        show(value))
            setattr(obj, key, checked(name, value, hints[key], fields[key], source))
            continue
        if key not in fields:
            where = f"in [{prefix[:-1]}]" if prefix else "at the top level"
            raise ConfigError(f"{source}unknown setting {name} (known {where}: {', '.join(sorted(fields))})")
        if _is_section(hints[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}{name} must be a table ([{name}]), got {show(value)}")
            _apply(getattr(obj, key), value, source, name + ".")
        elif _entry_type(hints[key]) is not None:    # [[models]]: a list of tables
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ConfigError(f"{source}{name} must be tables ([[{name}]]), got {show(value)}")
            entries = [_entry_type(hints[key])() for _ in value]
            for i, (entry, v) in enumerate(zip(entries, value)):
                _apply(entry, v, source, f"{name}[{i}].")
            setattr(obj, key, entries)
        else:
            setattr(obj, key, checked(name, value, hints[key], fields[key], source))


def _entry_type(hint: Any) -> Any:
    """The table type of a list-of-tables field (list[ModelEntry]), else None."""
    args = typing.get_args(hint) if typing.get_origin(hint) is list else ()
    return args[0] if args and _is_section(args[0]) else None


def _check_all(obj: Any, prefix: str = "") -> None:
    hints = _hints(type(obj))   # type: ignore[arg-type]  # mypy takes a class's __hash__ for unbound
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if _is_section(hints[f.name]):
            _check_all(value, prefix + f.name + ".")
        elif _entry_type(hints[f.name]) is not None:
            for i, entry in enumerate(value):
                _check_all(entry, f"{prefix}{f.name}[{i}].")
        else:
            checked(prefix + f.name, value, hints[f.name], f, "")


# -- loading -----------------------------------------------------------------------------------------
def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {' '.join(str(e).split())}") from None


def load_settings(path: str | Path | None = None,
                  overrides: dict[str, dict[str, Any]] | None = None) -> Settings:
    """Defaults, then the TOML file, then overrides such as {"model": {"path": "..."}} (None: not given)."""
    settings = Settings()
    if path is not None:
        _apply(settings, _read_toml(path), f"{path}: ")
    if overrides:
        clean = {k: {kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v
                 for k, v in overrides.items()}
        _apply(settings, clean, "flags: ")
    validate(settings)
    return settings


def validate(s: Settings) -> None:
    """Every field against its type and range (for Settings built in code), then the cross-field rules."""
    _check_all(s)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(s.cache.enable_prefix_caching or not (s.cache.pinned_prompts or s.cache.persist_dir),
         "cache.pinned_prompts and cache.persist_dir keep pages in the prefix cache: they need "
         "cache.enable_prefix_caching = true")
    need(s.scheduler.max_num_batched_tokens >= s.cache.block_size,
         f"scheduler.max_num_batched_tokens must be >= cache.block_size ({s.cache.block_size}), "
         f"got {s.scheduler.max_num_batched_tokens}")
    sp = s.speculative
    need(sp.prompt_lookup_min <= sp.prompt_lookup_max,
         f"speculative.prompt_lookup_min ({sp.prompt_lookup_min}) must be <= speculative.prompt_lookup_max "
         f"({sp.prompt_lookup_max})")
    need(sp.method != "draft" or bool(sp.draft_model),
         'speculative.method = "draft" needs speculative.draft_model: a model folder or .gguf sharing '
         "the target's tokenizer")
    need(s.watchdog.low_mb <= s.watchdog.high_mb,
         f"watchdog.low_mb ({s.watchdog.low_mb}) must be <= watchdog.high_mb ({s.watchdog.high_mb})")
    names = [m.name for m in s.models if m.name]
    need(len(names) == len(set(names)), f"models: two [[models]] share a name: {sorted(names)}")
    for i, m in enumerate(s.models):
        need(bool(m.path) != bool(m.source), f"models[{i}]: give path (a folder or .gguf file) or source (a "
             f"Hugging Face Hub reference such as ORG/REPO:Q4_K_M), one of them; got "
             f"{'both' if m.path else 'neither'}")
    need(bool(s.bundles.trusted_keys) or not s.bundles.require_signature,
         "bundles.require_signature = true needs bundles.trusted_keys: the public keys whose signatures "
         "are accepted")
    need(s.power.resume_c <= s.power.throttle_c,
         f"power.resume_c ({s.power.resume_c:g}) must be <= power.throttle_c ({s.power.throttle_c:g})")
    check_upstreams(s.upstreams)
