"""Regenerate the Python gRPC stubs from proto/nvllm/v1/nvllm.proto.

    .venv/bin/python tools/gen_proto.py            # writes daemon/nvllm/v1/nvllm_pb2{.py,.pyi,_grpc.py}
    .venv/bin/python tools/gen_proto.py --out DIR  # writes DIR/nvllm/v1/... instead (tests compare)

Run it after every change to the .proto and commit the .proto and the stubs together;
tests/server/grpc/test_proto_stubs.py fails when they disagree.

Layout: protoc runs with `-I proto`, so the file is named "nvllm/v1/nvllm.proto" in the descriptor
pool (what gRPC reflection serves) and the generated modules import each other as `nvllm.v1.*`.
Writing them under daemon/ makes that the Python package nvllm.v1, so those imports resolve with
no rewriting: `from nvllm.v1 import nvllm_pb2, nvllm_pb2_grpc`.

grpcio-tools is a development dependency only; the daemon needs grpcio and protobuf at runtime.
The generated code pins floors on both (see the version checks at the top of each stub).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ("nvllm/v1/nvllm.proto",)
DEFAULT_OUT = REPO / "daemon"
# The files protoc writes for each .proto, relative to the output directory.
GENERATED = ("nvllm/v1/nvllm_pb2.py", "nvllm/v1/nvllm_pb2.pyi", "nvllm/v1/nvllm_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over PROTO_FILES into out_dir; returns the written files."""
    from grpc_tools import protoc  # imported here: a dev dependency, absent on deployed boards

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",  # argv[0], ignored
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args[1:])}")
    return [out_dir / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output root; the stubs land in OUT/nvllm/v1/ (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
