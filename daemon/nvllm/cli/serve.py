"""nvllm serve: its flags laid over the settings file (settings_from_args), then the daemon
(server/daemon.py) or, with --dry-run, the memory plan (serve_plan.py). The daemon and the engine are
imported only when the command runs, so that `import nvllm.cli` (nvllm query, health) stays light."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nvllm.cli.flags import add_activations_flag, add_kv_cache_dtype_flag, add_quantization_flag, add_threads_flag
from nvllm.config import DEFAULT_MODEL_FILE, ConfigError, ModelEntry, Settings, load_settings, validate
from nvllm.server.logs import setup_logging

EXIT_CONFIG = 2   # as server/listen.py


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sv = sub.add_parser("serve", help="run the gRPC daemon")
    sv.add_argument("--config", help="TOML settings file (deploy/nvllm.toml documents every setting)")
    sv.add_argument("--model", default=None, action="append",
                    help="a model folder or .gguf file, or the name of either under model.models_dir "
                         f"(default: model.path, {DEFAULT_MODEL_FILE}); again for more models, the first "
                         "the default")
    sv.add_argument("--models-dir", default=None, metavar="DIR",
                    help="also serve every .gguf file and model folder in DIR, by its name (model.serve_dir)")
    sv.add_argument("--keep-alive", default=None, metavar="DURATION",
                    help='how long a model stays loaded after its last request: "5m" (the default), "30s", '
                         '0 (unload at once), -1 (never) (model.keep_alive)')
    sv.add_argument("--listen", default=None, help="host:port or unix:/path (default 127.0.0.1:50051)")
    sv.add_argument("--http-listen", default=None, metavar="HOST:PORT",
                    help="also serve the OpenAI-compatible HTTP API here, e.g. 127.0.0.1:8000 (http.listen)")
    sv.add_argument("--ollama-listen", default=None, metavar="HOST:PORT",
                    help="also serve the HTTP API (Ollama's /api/* among it) here, e.g. 127.0.0.1:11434, "
                         "where Ollama's clients look (http.ollama_listen)")
    sv.add_argument("--num-blocks", type=int, default=None, help="KV pages (overrides the sizing from memory)")
    sv.add_argument("--max-model-len", type=int, default=None)
    sv.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                    help="sequences running at once (scheduler.max_num_seqs, default 4); the default pool "
                         "holds N of max_model_len")
    sv.add_argument("--reasoning-parser", default=None, metavar="NAME",
                    help="send chat answers' <think> part apart from their content: qwen3 or deepseek_r1 "
                         "(server.reasoning_parser)")
    sv.add_argument("--context-overflow", default=None, choices=("error", "drop_oldest"),
                    help="a chat longer than the context: refuse it (error, the default) or drop its oldest "
                         "turns (server.context_overflow)")
    sv.add_argument("--task", default=None, choices=("auto", "generate", "embed", "rerank"),
                    help="what the model serves (model.task; default auto: read from its files)")
    add_quantization_flag(sv)
    add_activations_flag(sv)
    add_kv_cache_dtype_flag(sv)
    add_threads_flag(sv)
    sv.add_argument("--dry-run", action="store_true", help="print the memory sizing and exit")
    sv.add_argument("--memory-gb", type=float, default=None, metavar="N",
                    help="the memory every model's weights and page pool share (cache.budget_gb); with "
                         "--dry-run: plan for N GiB of available memory (another board's) instead of this "
                         "machine's, reading only config.json")
    sv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    return main(args)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings file with the flags over it. Several --model flags are models served by name, ahead of
    the file's [[models]]; one is model.path, as ever."""
    models = [args.model] if isinstance(args.model, str) else list(args.model or [])
    dry_run = getattr(args, "dry_run", False)
    overrides: dict[str, Any] = {
        "model": {"path": models[0] if models else None, "quantization": getattr(args, "quantization", None),
                  "activations": getattr(args, "activations", None), "threads": getattr(args, "threads", None),
                  "task": getattr(args, "task", None), "serve_dir": getattr(args, "models_dir", None),
                  "keep_alive": getattr(args, "keep_alive", None)},
        "server": {"listen": args.listen, "reasoning_parser": getattr(args, "reasoning_parser", None),
                   "context_overflow": getattr(args, "context_overflow", None)},
        "http": {"listen": getattr(args, "http_listen", None), "ollama_listen": getattr(args, "ollama_listen", None)},
        "cache": {"num_blocks": args.num_blocks, "dtype": getattr(args, "kv_cache_dtype", None),
                  "budget_gb": None if dry_run else getattr(args, "memory_gb", None)},
        "scheduler": {"max_model_len": args.max_model_len, "max_num_seqs": getattr(args, "max_num_seqs", None)},
    }
    settings = load_settings(args.config, overrides)
    if len(models) > 1 or (models and settings.models):
        settings.models[:0] = [ModelEntry(path=p) for p in models]
        validate(settings)
    return settings


def main(args: argparse.Namespace, **injected: Any) -> int:
    """`nvllm serve`; `injected` goes to Daemon (the tests' launcher passes its memory reader and
    signal handlers), nvllm itself passes nothing."""
    try:
        settings = settings_from_args(args)
    except ConfigError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.log_level)
    from nvllm.cli.model_sources import hub_puller, resolve_sources

    try:
        resolve_sources(settings)     # [[models]] source: pulled into model.models_dir unless already there
    except ConfigError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    memory_gb = getattr(args, "memory_gb", None)
    if memory_gb is not None and memory_gb <= 0:
        print("nvllm serve: --memory-gb N needs N > 0 (GiB)", file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        from nvllm.cli.serve_plan import dry_run

        return dry_run(settings, memory_gb)
    from nvllm.server.daemon import serve
    from nvllm.server.models.served_models import models_dir

    injected.setdefault("puller", hub_puller(models_dir(settings)))
    return serve(settings, **injected)

