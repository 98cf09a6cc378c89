"""nvllm serve | generate | query | health | bench | models

Each subcommand's flags and its work live in its own module here; flags.py holds the flags several share.
Modules import the engine lazily, inside their commands, so the clients start without it.
"""

from __future__ import annotations

import argparse

from nvllm import __version__
from nvllm.cli import bench, client, generate, models, serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvllm", description="An LLM serving daemon for edge boards.")
    p.add_argument("--version", action="version", version=f"nvllm {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    models.add_parser(sub)
    serve.add_parser(sub)
    client.add_parsers(sub)
    bench.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
