"""nvllm models reload NAME: ask a running daemon to put a new version of a served model in service (its files
as they are now: a bundle imported, a file replaced), over gRPC's ReloadModel (server/models/model_update.py).
It answers once the update is done; exit 0 when the new version serves (or there was nothing to swap), 1 when
it failed (the old version serves on; the reason is printed), 2 when no daemon answers."""

from __future__ import annotations

import argparse
import sys

from nvllm.cli.client import DEFAULT_TARGET, EXIT_UNREACHABLE, _add_tls_flags, _connect


def add_reload_parser(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mr = msub.add_parser("reload", help="put a new version of a served model in service in a running daemon",
                         description="The daemon loads the model's files as they are now beside the version "
                                     "serving (or after draining it, when memory holds only one), checks it with "
                                     "a short answer and swaps it in; running requests finish on the old one. "
                                     "A version that fails leaves the old one serving. SIGHUP to the daemon "
                                     "does this for every loaded model whose files changed.")
    mr.add_argument("name", help="the served model's name or alias")
    mr.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET})")
    mr.add_argument("--connect-timeout", type=float, default=5.0)
    mr.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the update (default 900)")
    _add_tls_flags(mr)


def cmd_reload(args: argparse.Namespace) -> int:
    import grpc

    from nvllm.v1 import nvllm_pb2 as pb
    from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

    channel, code = _connect("models reload", args)
    if channel is None:
        return code
    try:
        r = pb_grpc.GeneratorStub(channel).ReloadModel(pb.ReloadModelRequest(model=args.name), timeout=args.timeout)
    except grpc.RpcError as e:
        print(f"nvllm models reload: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_UNREACHABLE if e.code() == grpc.StatusCode.UNAVAILABLE else 1
    finally:
        channel.close()
    print(f"{r.model}: {r.outcome}: {r.reason}")
    return 1 if r.outcome == "failed" else 0
