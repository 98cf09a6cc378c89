"""nvllm serve | generate | query | health | bench | models"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from nvllm import __version__
from nvllm.config import DEFAULT_MODEL, DEFAULT_MODEL_FILE

DEFAULT_TARGET = "127.0.0.1:50051"


def _add_sampling_flags(p: argparse.ArgumentParser, greedy_default: bool) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=None, help="tokens to generate at most")
    g.add_argument("--min-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=0.0 if greedy_default else None,
                   help="0 = greedy" + (" (the default here)" if greedy_default else ""))
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    g.add_argument("--stop-token-id", type=int, action="append", default=None, dest="stop_token_ids")
    g.add_argument("--ignore-eos", action="store_true", default=None)
    g.add_argument("--include-stop-str", action="store_true", default=None, dest="include_stop_str_in_output")
    g.add_argument("--logprobs", type=int, default=None, help="top-N logprobs per token")


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags given, by SamplingParams' own field names (the flags' dests)."""
    from dataclasses import fields

    from nvllm.sampling_params import SamplingParams

    return {f.name: getattr(args, f.name) for f in fields(SamplingParams) if getattr(args, f.name, None) is not None}


def _read_prompts(args: argparse.Namespace) -> list[Any]:
    prompts: list[Any] = []
    if args.prompts_file:
        items = json.loads(Path(args.prompts_file).read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise SystemExit(f"{args.prompts_file}: expected a JSON list of prompts")
        for i, item in enumerate(items):
            if isinstance(item, str):
                prompts.append([{"role": "user", "content": item}] if args.chat else item)
            elif isinstance(item, dict) and ("messages" in item or "prompt_token_ids" in item):
                prompts.append(item["messages"] if "messages" in item else {"prompt_token_ids": item["prompt_token_ids"]})
            else:
                raise SystemExit(f"{args.prompts_file}: item {i} must be a string, "
                                 "{\"messages\": [...]} or {\"prompt_token_ids\": [...]}")
    for text in args.prompt:
        prompts.append([{"role": "user", "content": text}] if args.chat else text)
    if not prompts:
        raise SystemExit("no prompt: give PROMPT arguments or --prompts-file")
    return [{"messages": p} if isinstance(p, list) else p for p in prompts]


def cmd_generate(args: argparse.Namespace) -> int:
    from nvllm.config import ConfigError
    from nvllm.engine.factory import EngineBuildError
    from nvllm.llm import LLM, CompletionOutput
    from nvllm.sampling_params import InvalidParameter, SamplingParams

    prompts = _read_prompts(args)
    try:
        params = SamplingParams(**sampling_kwargs(args))
        llm = LLM(args.model, max_model_len=args.max_model_len, num_blocks=args.num_blocks,
                  quantization=args.quantization, threads=args.threads)
    except (ConfigError, EngineBuildError, InvalidParameter) as e:
        print(f"nvllm generate: {e}", file=sys.stderr)
        return 2
    try:
        started = time.perf_counter()   # the figures of --stats leave out loading the model
        results = [CompletionOutput("") for _ in prompts]
        for i, out in llm.stream(prompts, params):
            results[i].update(out)
            if args.stream and not args.json:
                if len(prompts) > 1 and out.text:
                    sys.stdout.write(f"[{i}] ")
                sys.stdout.write(out.text + ("\n" if out.finished else ""))
                sys.stdout.flush()
    except InvalidParameter as e:
        print(f"nvllm generate: {e}", file=sys.stderr)
        return 2
    for r in results:
        if r.error:
            print(f"nvllm generate: request failed: {r.error}", file=sys.stderr)
        if args.json:
            obj = {"text": r.text, "token_ids": r.token_ids, "prompt_tokens": r.prompt_tokens,
                   "completion_tokens": r.completion_tokens, "cached_tokens": r.cached_tokens,
                   "finish_reason": r.finish_reason}
            if r.logprobs is not None:
                obj["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob,
                                    "top": [[t.token_id, t.logprob] for t in lp.top]} for lp in r.logprobs]
            print(json.dumps(obj, ensure_ascii=False))
        elif not args.stream:
            print(r.text)
    if args.stats:
        st = llm.stats()
        wall = time.perf_counter() - started
        print(f"[{len(prompts)} prompts, {st['prompt_tokens_computed']} prompt tokens computed, "
              f"{st['generated_tokens']} generated in {wall:.2f} s: {st['generated_tokens'] / wall:.1f} tokens/s "
              f"overall; prefix cache hit rate {st['prefix_cache_hit_rate']:.1%}, "
              f"{st['preemptions']} preemptions, {st['steps']} steps]", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def cmd_models(args: argparse.Namespace) -> int:
    from nvllm import registry

    if args.action == "pull":
        try:
            path = registry.pull(args.name, args.dir, progress=not args.quiet, folder=args.folder)
        except registry.RegistryError as e:
            print(f"nvllm models pull: {e}", file=sys.stderr)
            return 1
        print(path)
        return 0
    models = registry.list_models(args.dir)
    if args.json:
        print(json.dumps(models, indent=2, default=str))
        return 0
    if not models:
        print(f"no models in {args.dir}; known: " + ", ".join(registry.KNOWN_MODELS)
              + f" (nvllm models pull {DEFAULT_MODEL})")
        return 0
    for m in models:
        print("  ".join(f"{k}={_list_value(v)}" for k, v in m.items()))
    return 0


def _list_value(v: object) -> str:
    """A `models list` value on one line: a GGUF's tensor types as Q4_1:210,F32:61."""
    if isinstance(v, dict):
        return ",".join(f"{k}:{n}" for k, n in v.items())
    return str(v)


# -- daemon and its clients -----------------------------------------------------------------
# The clients import only grpc and the generated stubs (no engine, no numpy): `nvllm query`
# starts fast on a small board.
EXIT_UNREACHABLE = 2


def cmd_serve(args: argparse.Namespace) -> int:
    from nvllm.server import app

    return app.main(args)


def _add_tls_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS (for a daemon with server.tls_cert; any of these turns TLS on)")
    g.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CA certificates")
    g.add_argument("--tls-ca", metavar="PEM", help="CA certificate(s) to trust for the daemon's certificate")
    g.add_argument("--tls-cert", metavar="PEM", help="client certificate chain (mutual TLS: server.tls_client_ca)")
    g.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    g.add_argument("--tls-server-name", metavar="NAME",
                   help="the name to expect in the daemon's certificate, when the target's host is not it")


def _channel_security(args: argparse.Namespace):
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


def _channel(target: str, timeout: float, args: argparse.Namespace | None = None):
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


def _wait_serving(channel, seconds: float) -> bool:
    """Poll Health until the daemon says SERVING (a daemon binds its port before the model loads)."""
    import time

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


def _connect(cmd: str, args: argparse.Namespace):
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


def build_request(args: argparse.Namespace):
    from nvllm.v1 import nvllm_pb2 as pb

    req = pb.GenerateRequest(request_id=args.request_id or "", model=args.model or "")
    if args.chat:
        req.chat.messages.add(role="user", content=args.prompt)
    else:
        req.prompt = args.prompt
    kw = sampling_kwargs(args)
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
    last = None
    try:
        for resp in stub.Generate(build_request(args), timeout=args.timeout):
            text.append(resp.text)
            token_ids.extend(resp.token_ids)
            last = resp
            if not args.json and resp.text:
                sys.stdout.write(resp.text)
                sys.stdout.flush()
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
    if finish == "abort":
        print("nvllm query: the daemon aborted the request (it is shutting down)", file=sys.stderr)
        return 1
    return 0


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
        print(f"  pages {h.pages_total} total, {h.pages_free} free, {h.pages_cached} cached; "
              f"{h.running} running, {h.waiting} waiting; {h.tokens_per_s:.1f} tokens/s")
        print(f"  memory available {h.available_memory_bytes // mib} MiB "
              f"(watchdog low {h.watchdog_low_bytes // mib} MiB, high {h.watchdog_high_bytes // mib} MiB)")
    return 0 if h.state == pb.HealthResponse.STATE_SERVING else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from nvllm import bench
    from nvllm.config import ConfigError
    from nvllm.engine.factory import EngineBuildError

    def numbers(text: str, flag: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise SystemExit(f"nvllm bench: {flag} takes positive whole numbers separated by commas, got {text!r}")
        return values

    try:
        bench.run(None if args.target else Path(args.model), numbers(args.concurrency, "--concurrency"),
                  args.prompt_len, args.gen_len, args.target, args.json,
                  numbers(args.prefill_len, "--prefill-len"), args.threads, args.quantization)
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    return 0


def _add_quantization_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", default=None, metavar="FORMAT",
                   help="a folder's weights in memory: f32, or re-quantized at load to q8_0, q4_0, q4_k, bf16 "
                        "or f16 (model.quantization; default: as stored, 16-bit matrices kept 16-bit)")


def _add_threads_flag(p: argparse.ArgumentParser, default: int | None = None) -> None:
    p.add_argument("--threads", "--blas-threads", dest="threads", type=int, default=default, metavar="N",
                   help="threads for the matmuls (model.threads; 0: one per usable core but one, the cgroup's "
                        "CPU quota counted); --blas-threads is its old name")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvllm", description="An LLM serving daemon for edge boards.")
    p.add_argument("--version", action="version", version=f"nvllm {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="run prompts offline, in this process, batched")
    g.add_argument("prompt", nargs="*", help="prompt text (several run as one batch)")
    g.add_argument("--model", default=f"models/{DEFAULT_MODEL_FILE}",
                   help="a Hugging Face model folder or a .gguf file")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    g.add_argument("--prompts-file", help='JSON list of strings, {"messages": [...]} or {"prompt_token_ids": [...]}')
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--stream", action="store_true", help="print text as it is produced")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--num-blocks", type=int, default=None, help="KV pages (default: sized from memory)")
    g.add_argument("--stats", action="store_true",
                   help="print tokens/s, prefix-cache hit rate and preemptions to stderr at the end")
    _add_quantization_flag(g)
    _add_threads_flag(g)
    _add_sampling_flags(g, greedy_default=True)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="pull or list models")
    msub = m.add_subparsers(dest="action", required=True)
    mp = msub.add_parser("pull", help="fetch a known model's GGUF into DIR (the folder too with --folder)")
    mp.add_argument("name")
    mp.add_argument("--dir", default="models")
    mp.add_argument("--quiet", action="store_true")
    mp.add_argument("--folder", action="store_true",
                    help="also write the float32 Hugging Face folder DIR/NAME (538 MB for the default model, "
                         "for model.quantization and tools/quality.py); the GGUF DIR/NAME.gguf is always kept")
    ml = msub.add_parser("list", help="models in DIR")
    ml.add_argument("--dir", default="models")
    ml.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)

    sv = sub.add_parser("serve", help="run the gRPC daemon")
    sv.add_argument("--config", help="TOML settings file (deploy/nvllm.toml documents every setting)")
    sv.add_argument("--model", default=None,
                    help="a model folder or .gguf file, or the name of either under model.models_dir "
                         f"(default: model.path, {DEFAULT_MODEL_FILE})")
    sv.add_argument("--listen", default=None, help="host:port or unix:/path (default 127.0.0.1:50051)")
    sv.add_argument("--http-listen", default=None, metavar="HOST:PORT",
                    help="also serve the OpenAI-compatible HTTP API here, e.g. 127.0.0.1:8000 (http.listen)")
    sv.add_argument("--num-blocks", type=int, default=None, help="KV pages (overrides the sizing from memory)")
    sv.add_argument("--max-model-len", type=int, default=None)
    _add_quantization_flag(sv)
    _add_threads_flag(sv)
    sv.add_argument("--dry-run", action="store_true", help="print the memory sizing and exit")
    sv.add_argument("--memory-gb", type=float, default=None, metavar="N",
                    help="with --dry-run: plan for N GiB of available memory (another board's) instead of "
                         "this machine's; reads only config.json")
    sv.set_defaults(func=cmd_serve)

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
    _add_sampling_flags(q, greedy_default=True)
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

    b = sub.add_parser("bench", help="throughput and latency beside this machine's own floors")
    b.add_argument("--model", default=f"models/{DEFAULT_MODEL_FILE}",
                   help="a model folder or .gguf file (in-process run)")
    b.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of requests in flight")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--gen-len", type=int, default=64)
    b.add_argument("--prefill-len", default="128,512", help="comma-separated prompt lengths for prefill")
    b.add_argument("--target", default=None, help="measure a running daemon over gRPC instead")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    _add_threads_flag(b, default=0)
    _add_quantization_flag(b)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
