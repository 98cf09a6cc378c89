"""nvllm query | health: clients of a running daemon, over gRPC with TLS when asked.

They import only grpc and the generated stubs (no engine, no numpy), so `nvllm query` starts fast on a
small board.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvllm.cli.flags import add_sampling_flags, bound_note, default_bound, sampling_kwargs

if TYPE_CHECKING:
    import grpc

    from nvllm.v1 import nvllm_pb2

DEFAULT_TARGET = "127.0.0.1:50051"
EXIT_UNREACHABLE = 2


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = sub.add_parser("query", help="send one prompt to a running daemon and stream the answer")
    q.add_argument("prompt")
    q.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET})")
    q.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    q.add_argument("--json", action="store_true",
                   help="print one JSON object (text, token_ids, finish_reason, usage) at the end")
    q.add_argument("--model", default=None, help="the served model's name (checked by the daemon)")
    q.add_argument("--request-id", default=None)
    q.add_argument("--timeout", type=float, default=None, help="deadline in seconds for the whole answer")
    q.add_argument("--connect-timeout", type=float, default=5.0)
    q.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                   help="first wait up to SECONDS for the daemon to be SERVING (e.g. right after start)")
    q.add_argument("-v", "--verbose", action="store_true", help="print usage and time to first token to stderr")
    add_sampling_flags(q, greedy_default=True)
    _add_tls_flags(q)
    q.set_defaults(func=cmd_query)

    hp = sub.add_parser("health", help="a daemon's state; exit 0 only when SERVING (1 otherwise, 2 unreachable)")
    hp.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET})")
    hp.add_argument("--json", action="store_true")
    hp.add_argument("--connect-timeout", type=float, default=5.0)
    hp.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                    help="wait up to SECONDS for the daemon to be SERVING")
    _add_tls_flags(hp)
    hp.set_defaults(func=cmd_health)


def _add_tls_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS (for a daemon with server.tls_cert; any of these turns TLS on)")
    g.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CA certificates")
    g.add_argument("--tls-ca", metavar="PEM", help="CA certificate(s) to trust for the daemon's certificate")
    g.add_argument("--tls-cert", metavar="PEM", help="client certificate chain (mutual TLS: server.tls_client_ca)")
    g.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    g.add_argument("--tls-server-name", metavar="NAME",
                   help="the name to expect in the daemon's certificate, when the target's host is not it")


def _channel_security(args: argparse.Namespace) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
    """(credentials or None for plaintext, channel options) from the TLS flags."""
    import grpc

    ca, cert, key = (getattr(args, name, None) for name in ("tls_ca", "tls_cert", "tls_key"))
    name = getattr(args, "tls_server_name", None)
    if not (getattr(args, "tls", False) or ca or cert or key or name):
        return None, []
    if bool(cert) != bool(key):
        raise SystemExit("nvllm: --tls-cert and --tls-key go together")

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise SystemExit(f"nvllm: cannot read {path}: {e.strerror}") from None

    creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                         certificate_chain=read(cert))
    return creds, ([("grpc.ssl_target_name_override", name)] if name else [])


def _channel(target: str, timeout: float, args: argparse.Namespace | None = None) -> grpc.Channel | None:
    """A channel that is connected, or None (with the message printed) when nothing answers."""
    import grpc

    creds, options = _channel_security(args) if args is not None else (None, [])
    channel = grpc.secure_channel(target, creds, options) if creds else grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        return None
    return channel


def _wait_serving(channel: grpc.Channel, seconds: float) -> bool:
    """Poll Health until the daemon says SERVING (a daemon binds its port before the model loads)."""
    import grpc

    from nvllm.v1 import nvllm_pb2 as pb
    from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

    stub = pb_grpc.GeneratorStub(channel)
    deadline = time.monotonic() + seconds
    while True:
        try:
            if stub.Health(pb.HealthRequest(), timeout=5).state == pb.HealthResponse.STATE_SERVING:
                return True
        except grpc.RpcError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _connect(cmd: str, args: argparse.Namespace) -> tuple[grpc.Channel | None, int]:
    """A connected channel (after waiting for SERVING when --wait is given), or an exit code."""
    wait = getattr(args, "wait", 0) or 0
    channel = _channel(args.target, max(args.connect_timeout, wait), args)
    if channel is None:
        return None, _unreachable(cmd, args.target, max(args.connect_timeout, wait))
    if wait and not _wait_serving(channel, wait):
        channel.close()
        print(f"nvllm {cmd}: the daemon at {args.target} was not SERVING within {wait:g} s "
              f"(nvllm health --target {args.target} tells why)", file=sys.stderr)
        return None, 1
    return channel, 0


def _unreachable(cmd: str, target: str, timeout: float) -> int:
    print(f"nvllm {cmd}: no nvllm daemon answers at {target} (waited {timeout:g} s); "
          f"is it running (nvllm serve, systemctl status nvllm) and is --target right? "
          f"(a daemon serving TLS needs --tls-ca, and with mutual TLS --tls-cert/--tls-key)", file=sys.stderr)
    return EXIT_UNREACHABLE


def build_request(args: argparse.Namespace, bounded: bool = True) -> nvllm_pb2.GenerateRequest:
    """The request the flags ask for; without --max-tokens it carries the default bound (bounded=False:
    max_tokens unset, up to the end of the context)."""
    from nvllm.v1 import nvllm_pb2 as pb

    req = pb.GenerateRequest(request_id=args.request_id or "", model=args.model or "")
    if args.chat:
        req.chat.messages.add(role="user", content=args.prompt)
    else:
        req.prompt = args.prompt
    kw = sampling_kwargs(args)
    bound = default_bound(args)
    if bounded and bound is not None:
        kw["max_tokens"] = bound
    sp = req.sampling_params
    for name, value in kw.items():
        if name in ("stop", "stop_token_ids"):
            getattr(sp, name).extend(value)
        else:
            setattr(sp, name, value)
    req.sampling_params.SetInParent()
    return req


def cmd_query(args: argparse.Namespace) -> int:
    import grpc

    from nvllm.v1 import nvllm_pb2 as pb
    from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

    channel, code = _connect("query", args)
    if channel is None:
        return code
    stub = pb_grpc.GeneratorStub(channel)
    text: list[str] = []
    token_ids: list[int] = []
    bound = default_bound(args)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        try:
            last = _stream(stub, build_request(args), args.json, deadline, text, token_ids)
        except grpc.RpcError as e:
            if bound is None or text or not _bound_refused(e):
                raise
            # the default bound is more than the prompt leaves of the context: ask for what it leaves
            bound = None
            last = _stream(stub, build_request(args, bounded=False), args.json, deadline, text, token_ids)
    except grpc.RpcError as e:
        if not args.json and text:
            sys.stdout.write("\n")
        print(f"nvllm query: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    finish = pb.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower() if last else None
    if args.json:
        obj: dict[str, Any] = {"request_id": last.request_id if last else "", "text": "".join(text),
                               "token_ids": token_ids, "finish_reason": finish}
        if last is not None:
            obj["usage"] = {"prompt_tokens": last.usage.prompt_tokens,
                            "completion_tokens": last.usage.completion_tokens,
                            "cached_tokens": last.usage.cached_tokens}
            obj["time_to_first_token_ms"] = (last.time_to_first_token_ms
                                             if last.HasField("time_to_first_token_ms") else None)
            which = last.WhichOneof("stop_reason")
            if which:
                obj["stop_reason"] = getattr(last, which)
        print(json.dumps(obj, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if args.verbose and last is not None:
            u = last.usage
            print(f"[{finish}; {u.prompt_tokens} prompt + {u.completion_tokens} output tokens, "
                  f"first token after {last.time_to_first_token_ms:.0f} ms]", file=sys.stderr)
    if bound is not None and finish == "length" and last is not None and last.usage.completion_tokens >= bound:
        print(bound_note("query", bound), file=sys.stderr)
    if finish == "abort":
        print("nvllm query: the daemon aborted the request (it is shutting down)", file=sys.stderr)
        return 1
    return 0


def _stream(stub: Any, req: nvllm_pb2.GenerateRequest, as_json: bool, deadline: float | None,
            text: list[str], token_ids: list[int]) -> nvllm_pb2.GenerateResponse | None:
    """One Generate call: its text and token ids appended (and the text printed unless as_json); the
    last response, or None when none came."""
    last = None
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    for resp in stub.Generate(req, timeout=timeout):
        text.append(resp.text)
        token_ids.extend(resp.token_ids)
        last = resp
        if not as_json and resp.text:
            sys.stdout.write(resp.text)
            sys.stdout.flush()
    return last


def _bound_refused(e: grpc.RpcError) -> bool:
    """The daemon refused the default max_tokens: more than the model's context, or than the prompt leaves."""
    import grpc

    return e.code() == grpc.StatusCode.INVALID_ARGUMENT and \
        (e.details() or "").startswith("sampling_params.max_tokens must be ")


def cmd_health(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf import json_format

    from nvllm.v1 import nvllm_pb2 as pb
    from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

    channel, code = _connect("health", args)
    if channel is None:
        return code
    try:
        h = pb_grpc.GeneratorStub(channel).Health(pb.HealthRequest(), timeout=args.connect_timeout)
    except grpc.RpcError as e:
        print(f"nvllm health: {e.code().name}: {e.details()}", file=sys.stderr)
        return EXIT_UNREACHABLE if e.code() == grpc.StatusCode.UNAVAILABLE else 1
    finally:
        channel.close()
    state = pb.HealthResponse.State.Name(h.state).removeprefix("STATE_")
    if args.json:
        obj = json_format.MessageToDict(h, preserving_proto_field_name=True,
                                        always_print_fields_with_no_presence=True)
        obj["state"] = state
        print(json.dumps(obj))
    else:
        line = f"{state}"
        if h.not_admitting_reason:
            line += f": {h.not_admitting_reason}"
        print(line)
        mib = 1 << 20
        print(f"  model {h.model}, nvllm {h.version}, up {h.uptime_s:.0f} s (ready after {h.startup_s:.1f} s)")
        backed = f" ({h.pages_backed} backed so far)" if h.pages_backed < h.pages_total else ""
        if h.pages_total:
            print(f"  pages {h.pages_total} total{backed} of {h.page_bytes // 1024} KiB ({h.kv_cache_dtype} keys and "
                  f"values), {h.pages_free} free, {h.pages_cached} cached; "
                  f"{h.running} running, {h.waiting} waiting; {h.tokens_per_s:.1f} tokens/s")
        else:
            print(f"  the default model {h.model} is not loaded now (its next request loads it)")
        print(f"  memory available {h.available_memory_bytes // mib} MiB "
              f"(watchdog low {h.watchdog_low_bytes // mib} MiB, high {h.watchdog_high_bytes // mib} MiB); "
              f"models hold {h.memory_held_bytes // mib} of a {h.memory_budget_bytes // mib} MiB budget")
        for m in h.models:
            model_state = pb.ModelHealth.State.Name(m.state).removeprefix("STATE_").lower()
            keep = "pinned" if m.pinned else "kept for good" if m.keep_alive_s < 0 else \
                f"keep_alive {m.keep_alive_s:g} s"
            pages = f", {m.running} running, {m.waiting} waiting, {m.pages_free}/{m.pages_total} pages free" \
                if m.state == pb.ModelHealth.STATE_LOADED else ""
            print(f"  {'*' if m.default else ' '} {m.name}: {model_state}, {m.bytes // mib} MiB{pages}; "
                  f"{m.requests} requests, {m.loads} loads; {keep}")
            if m.update_state:
                retiring = f", {m.retiring} old versions finishing" if m.retiring else ""
                print(f"      last update: {m.update_state}{retiring}" +
                      (f": {m.update_error}" if m.update_error else ""))
        if h.thermal_throttled or h.HasField("cpu_temperature_celsius"):   # neither with [power] off
            temp = f"CPU at {h.cpu_temperature_celsius:.1f} C" if h.HasField("cpu_temperature_celsius") else \
                "no CPU thermal zone"
            print(f"  heat: {temp}, " + (f"THROTTLED: {h.throttle_reason}" if h.thermal_throttled else "not throttled"))
    return 0 if h.state == pb.HealthResponse.STATE_SERVING else 1
