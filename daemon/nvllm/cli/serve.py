"""nvllm serve: the daemon (server/app.py), its flags laid over the settings file."""

from __future__ import annotations

import argparse

from nvllm.cli.flags import add_activations_flag, add_kv_cache_dtype_flag, add_quantization_flag, add_threads_flag
from nvllm.config import DEFAULT_MODEL_FILE


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
    from nvllm.server import app

    return app.main(args)
