"""Stress 5, security: where the daemon listens, TLS and mutual TLS, the caps on what one request or
one client may take, model folders that are refused, and request content that stays data.

Test certificates are made with the `openssl` command line in a temporary folder (EC P-256, valid
for two days); the server's names only "nvllm.test", so clients dial 127.0.0.1 with that name as
the expected one (--tls-server-name / grpc.ssl_target_name_override).
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest

from helpers.daemon_util import (
    BASE_CONFIG,
    MAX_MESSAGE_BYTES,
    ROOT,
    DaemonProcess,
    assert_sound,
    collect,
    config_with,
    health,
    joined,
    offline_result,
    request,
    run_bounded,
)
from nvllm.config import Settings, load_settings
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.stress, pytest.mark.slow]

SERVER_NAME = "nvllm.test"




def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


# -- where it listens ------------------------------------------------------------------------------
def is_loopback_listen(listen: str) -> bool:
    from nvllm.server.listen import is_loopback
    return listen.startswith("unix:") or is_loopback(listen.rsplit(":", 1)[0])


def test_loopback_by_default_in_the_code_and_the_shipped_config() -> None:
    assert Settings().server.listen == "127.0.0.1:50051"
    shipped = load_settings(ROOT / "deploy" / "nvllm.toml").server
    assert is_loopback_listen(shipped.listen)
    assert not (shipped.tls_cert or shipped.tls_key or shipped.tls_client_ca)   # loopback needs none
    assert shipped.unix_socket_mode & 0o007 == 0                                 # no access for others
    assert shipped.max_streams_per_client > 0


def test_the_daemon_listens_on_loopback_only(tiny: Path, tmp_path: Path, offline) -> None:
    d = DaemonProcess(tmp_path, tiny)
    try:
        listening = [c.laddr for c in psutil.Process(d.pid).net_connections(kind="inet") if c.status == "LISTEN"]
        assert listening and all(is_loopback_listen(f"{a.ip}:{a.port}") for a in listening), listening
        assert_sound(d, offline)
    finally:
        d.stop()


def test_a_non_loopback_address_without_tls_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from nvllm.server import listen

    class Server:      # stands in for grpc.aio.Server: nothing is bound
        def add_insecure_port(self, address: str) -> int:
            return 50051

    settings = Settings()
    settings.server.listen = "0.0.0.0:50051"
    with caplog.at_level(logging.WARNING, logger="nvllm.server.listen"):
        listen.bind(Server(), settings)
    assert "listening on 0.0.0.0:50051 without TLS" in caplog.text
    caplog.clear()
    for address in ("127.0.0.1:50051", "[::1]:50051", "localhost:50051"):
        settings.server.listen = address
        with caplog.at_level(logging.WARNING, logger="nvllm.server.listen"):
            listen.bind(Server(), settings)
    assert "without TLS" not in caplog.text


def test_a_unix_socket_gets_the_configured_mode(tiny: Path, tmp_path: Path, offline) -> None:
    sock = tmp_path / "private.sock"
    config = config_with(BASE_CONFIG, server__unix_socket_mode=0o600)
    d = DaemonProcess(tmp_path / "d", tiny, config, listen=f"unix:{sock}")
    try:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert_sound(d, offline)
    finally:
        d.stop()


# -- TLS ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem signs server.pem (names nvllm.test) and client.pem; rogue-ca.pem signs rogue.pem."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "rogue-ca"):
        run("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
            "-subj", f"/CN=nvllm test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, ca, ext in (("server", "ca", f"subjectAltName=DNS:{SERVER_NAME}\nextendedKeyUsage=serverAuth\n"),
                          ("client", "ca", "extendedKeyUsage=clientAuth\n"),
                          ("rogue", "rogue-ca", "extendedKeyUsage=clientAuth\n")):
        run("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return d


def tls_connect(address: str, certs: Path, client: str | None = None, name: str | None = SERVER_NAME):
    """A function making a TLS channel to address, trusting ca.pem, presenting client.pem/rogue.pem."""
    def connect() -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(
            root_certificates=(certs / "ca.pem").read_bytes(),
            private_key=(certs / f"{client}.key").read_bytes() if client else None,
            certificate_chain=(certs / f"{client}.pem").read_bytes() if client else None)
        return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", name)] if name else [])
    return connect


def refused_at_handshake(connect) -> bool:
    with pytest.raises(grpc.RpcError) as e:
        health("", connect)
    return e.value.code() == grpc.StatusCode.UNAVAILABLE


def tls_config(certs: Path, mutual: bool) -> str:
    extra = dict(server__tls_cert=str(certs / "server.pem"), server__tls_key=str(certs / "server.key"))
    if mutual:
        extra["server__tls_client_ca"] = str(certs / "ca.pem")
    return config_with(BASE_CONFIG, **extra)


def test_tls_when_configured(tiny: Path, tmp_path: Path, certs: Path, offline, reliability) -> None:
    d = DaemonProcess(tmp_path, tiny, tls_config(certs, mutual=False))
    try:
        assert_sound(d, offline, connect=tls_connect(d.address, certs))
        assert refused_at_handshake(lambda: grpc.insecure_channel(d.address))       # no plaintext
        assert refused_at_handshake(tls_connect(d.address, certs, name=None))       # 127.0.0.1 is not its name

        tls = ("--tls-ca", str(certs / "ca.pem"), "--tls-server-name", SERVER_NAME)
        q = run_cli("query", "--target", d.address, "--json", "--max-tokens", "8", *tls, "The quick brown fox")
        assert q.returncode == 0, q.stderr
        want = offline_result(offline, "The quick brown fox", temperature=0, max_tokens=8)
        assert json.loads(q.stdout)["token_ids"] == want.token_ids
        h = run_cli("health", "--target", d.address, "--json", *tls)
        assert h.returncode == 0 and json.loads(h.stdout)["state"] == "SERVING", h.stderr
        plain = run_cli("health", "--target", d.address, "--connect-timeout", "2")
        assert plain.returncode == 2 and "--tls-ca" in plain.stderr
        half = run_cli("health", "--target", d.address, "--tls-cert", str(certs / "client.pem"))
        assert half.returncode != 0 and "--tls-cert and --tls-key go together" in half.stderr
    finally:
        d.stop()


def test_mutual_tls_when_a_client_ca_is_configured(tiny: Path, tmp_path: Path, certs: Path, offline,
                                                  reliability) -> None:
    d = DaemonProcess(tmp_path, tiny, tls_config(certs, mutual=True))
    try:
        assert_sound(d, offline, connect=tls_connect(d.address, certs, client="client"))
        refusals = [refused_at_handshake(tls_connect(d.address, certs)),                 # no certificate
                    refused_at_handshake(tls_connect(d.address, certs, client="rogue")),  # another CA's
                    refused_at_handshake(lambda: grpc.insecure_channel(d.address))]      # plaintext
        assert refusals == [True, True, True]
        tls = ("--tls-ca", str(certs / "ca.pem"), "--tls-server-name", SERVER_NAME)
        mine = ("--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client.key"))
        q = run_cli("query", "--target", d.address, "--max-tokens", "4", *tls, *mine, "hello")
        assert q.returncode == 0, q.stderr
        no_cert = run_cli("health", "--target", d.address, "--connect-timeout", "2", *tls)
        assert no_cert.returncode == 2
        h = run_cli("health", "--target", d.address, *tls, *mine)
        assert h.returncode == 0 and h.stdout.startswith("SERVING"), h.stderr
        reliability("tls", plaintext_refused=True, wrong_name_refused=True, mutual_tls_no_cert_refused=True,
                    mutual_tls_other_ca_refused=True, cli_query_and_health_over_tls=True)
    finally:
        d.stop()


def test_a_client_ca_without_a_server_certificate_refuses_to_start(tiny: Path, tmp_path: Path,
                                                                   certs: Path) -> None:
    cfg = tmp_path / "nvllm.toml"
    cfg.write_text(config_with(BASE_CONFIG, server__tls_client_ca=str(certs / "ca.pem")))
    r = run_cli("serve", "--config", str(cfg), "--model", str(tiny), "--listen", "127.0.0.1:0", "--num-blocks", "64")
    assert r.returncode == 2
    assert "server.tls_client_ca (mutual TLS) needs server.tls_cert and server.tls_key" in r.stderr


# -- caps ------------------------------------------------------------------------------------------
STREAM_LIMIT = 4


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_caps_on_size_prompt_stop_strings_and_streams_per_client(tiny: Path, tmp_path: Path, offline,
                                                                  reliability) -> None:
    config = config_with(BASE_CONFIG, server__max_streams_per_client=STREAM_LIMIT)
    # "localhost" listens on 127.0.0.1 and ::1: two client addresses on one machine.
    d = DaemonProcess(tmp_path, tiny, config, listen="localhost:0" if ipv6_loopback() else "127.0.0.1:0")
    v4 = f"127.0.0.1:{d.port}"
    try:
        with grpc.insecure_channel(v4, options=[("grpc.max_send_message_length", 8 * MAX_MESSAGE_BYTES)]) as ch:
            stub = pb_grpc.GeneratorStub(ch)

            def refusal(req: pb.GenerateRequest) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.RpcError) as e:
                    list(stub.Generate(req, timeout=30))
                return e.value.code(), e.value.details()

            code, details = refusal(request("x" * (MAX_MESSAGE_BYTES + 10)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert details.startswith("prompt makes the request") and "(server.max_message_bytes)" in details
            code, _ = refusal(request("x" * (3 * MAX_MESSAGE_BYTES)))      # past the transport's cap
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            code, details = refusal(request("hello " * 300, max_tokens=4))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert details.startswith("prompt must be shorter than max_model_len 256 tokens")
            code, details = refusal(request(max_tokens=4, stop=["a", "b", "c", "d", "e"]))
            assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT,
                                       "sampling_params.stop must be at most 4 strings, got 5 strings")
            code, details = refusal(request(max_tokens=4, stop=["s" * 257]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "of at most 256 characters" in details

        async def streams():
            async with grpc.aio.insecure_channel(v4) as a, grpc.aio.insecure_channel(v4) as b:
                held = [pb_grpc.GeneratorStub(ch).Generate(request(f"held {i}", max_tokens=60, ignore_eos=True,
                                                                   temperature=0.0))
                        for i, ch in enumerate([a, b, a, b])]            # one client over two connections
                for c in held:
                    await c.read()
                d.stall()                                                # the four stay open meanwhile
                extra = pb_grpc.GeneratorStub(a).Generate(request("one too many", max_tokens=2))
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await extra.read()
                other = None
                if d.address.startswith("localhost"):                    # another address is another client
                    async with grpc.aio.insecure_channel(f"[::1]:{d.port}") as c6:
                        call = asyncio.ensure_future(collect(pb_grpc.GeneratorStub(c6),
                                                             request("from ::1", max_tokens=3, temperature=0.0)))
                        # Admitted while the four are still open: it waits for the engine, not refused.
                        health_a = pb_grpc.GeneratorStub(a).Health
                        while not call.done() and (await health_a(pb.HealthRequest())).waiting < 1:
                            await asyncio.sleep(0.01)
                        d.resume()
                        other = await call
                else:
                    d.resume()
                for c in held:
                    while await c.read() is not grpc.aio.EOF:
                        pass
                again = [r async for r in pb_grpc.GeneratorStub(a).Generate(request("again", max_tokens=3))]
                return e.value, other, again

        err, other, again = run_bounded(streams())
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == (f"too many concurrent streams from 127.0.0.1: {STREAM_LIMIT} open, "
                                 f"limit {STREAM_LIMIT} (server.max_streams_per_client)")
        if other is not None:
            want = offline_result(offline, "from ::1", max_tokens=3, temperature=0.0)
            assert joined(other) == (want.text, want.token_ids)
        assert again[-1].usage.completion_tokens == 3
        h = assert_sound(d, offline, connect=lambda: grpc.insecure_channel(v4))
        reliability("caps", message_bytes_limit=MAX_MESSAGE_BYTES, prompt_tokens_limit=256, stop_strings_limit=4,
                    stop_string_chars_limit=256, streams_per_client_limit=STREAM_LIMIT,
                    other_address_served=other is not None,
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()


# -- model folders that are refused ---------------------------------------------------------------
def test_serve_refuses_a_model_folder_with_a_pickle_or_an_outside_link(tiny: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the model\n")
    cases = {}
    pickled = tmp_path / "pickled"
    shutil.copytree(tiny, pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")              # a pickle of the int 1
    cases[pickled] = "pickle checkpoints are never opened"
    linked = tmp_path / "linked"
    shutil.copytree(tiny, linked)
    (linked / "notes.json").symlink_to(secret)
    cases[linked] = "a link leading outside the model folder"
    relinked = tmp_path / "relinked"
    shutil.copytree(tiny, relinked)
    (relinked / "tokenizer.json").unlink()
    (relinked / "tokenizer.json").symlink_to(Path("..") / "linked" / "tokenizer.json")
    cases[relinked] = "a link leading outside the model folder"
    for folder, reason in cases.items():
        r = run_cli("serve", "--model", str(folder), "--listen", "127.0.0.1:0", "--num-blocks", "64")
        assert r.returncode == 2, (folder.name, r.returncode, r.stderr)
        assert f"nvllm serve: cannot load the model at {folder}" in r.stderr and reason in r.stderr, r.stderr
        assert "nvllm serving" not in r.stdout


# -- request content stays data -------------------------------------------------------------------
TEMPLATE_SYNTAX = ["{{ 7*7 }}", "{% for x in range(3) %}x{% endfor %}", "{{ raise_exception('boom') }}",
                   "{{ ''.__class__.__mro__[1].__subclasses__() }}", "{# comment #}", "{% set x = 1 %}{{ x }}"]


def test_chat_content_and_roles_reach_the_prompt_literally(tiny: Path, tmp_path: Path, offline) -> None:
    from nvllm.text.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(tiny)
    d = DaemonProcess(tmp_path, tiny)
    try:
        with grpc.insecure_channel(d.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            for text in TEMPLATE_SYNTAX:
                messages = [{"role": "system", "content": text}, {"role": "user", "content": f"say {text}"},
                            {"role": text, "content": "and the role"}]
                rendered = tok.render_chat(messages)
                assert f"system\n{text}<|im_end|>" in rendered and f"user\nsay {text}<|im_end|>" in rendered
                assert f"<|im_start|>{text}\nand the role" in rendered and "49" not in rendered
                req = pb.GenerateRequest(sampling_params=pb.SamplingParams(temperature=0, max_tokens=6))
                for m in messages:
                    req.chat.messages.add(**m)
                via_chat = list(stub.Generate(req, timeout=30))
                ids = tok.encode_chat(messages)
                via_ids = list(stub.Generate(pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=ids),
                                                                sampling_params=req.sampling_params), timeout=30))
                assert via_chat[-1].usage.prompt_tokens == len(ids)
                assert joined(via_chat) == joined(via_ids)
        assert_sound(d, offline)
    finally:
        d.stop()


def test_request_fields_never_reach_a_shell_or_a_path(tiny: Path, tmp_path: Path, offline) -> None:
    marker = tmp_path / "pwned"
    d = DaemonProcess(tmp_path / "d", tiny)
    try:
        with grpc.insecure_channel(d.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            for rid in (f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}", "../../../etc/passwd"):
                req = request(f"$(touch {marker}) and `touch {marker}`", max_tokens=2)
                req.request_id = rid
                assert {r.request_id for r in stub.Generate(req, timeout=30)} == {rid}
            for model in ("../tiny-qwen2", str(tiny.parent / "tiny-qwen2"), "/etc/passwd", "tiny-llama/../tiny-qwen2"):
                with pytest.raises(grpc.RpcError) as e:
                    list(stub.Generate(pb.GenerateRequest(model=model, prompt="hi"), timeout=30))
                # a name, never a path: no other folder is read as a model
                assert e.value.code() == grpc.StatusCode.NOT_FOUND and e.value.details().startswith("the model")
        assert not marker.exists()
        assert_sound(d, offline)
    finally:
        d.stop()


# The modules a request passes through: none may run a shell, load pickles, eval, or build a jinja
# environment other than the sandboxed one in text/chat_template.py.
REQUEST_PATH = ["server", "engine", "model", "text", "sampling_params.py", "v1"]
FORBIDDEN_MODULES = {"subprocess", "pickle", "shelve", "marshal", "dill", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "system", "popen", "spawnl", "spawnv", "execv",
                   "execvp", "load", "Environment", "Template", "from_string"}


def test_no_shell_pickle_eval_or_unsandboxed_template_on_the_request_path() -> None:
    package = ROOT / "daemon" / "nvllm"
    files = [f for part in REQUEST_PATH for f in ([package / part] if part.endswith(".py")
                                                   else sorted((package / part).rglob("*.py")))]
    found = []
    for f in files:
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module:
                    names.append(node.module)
                found += [f"{f.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                base = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
                if name in FORBIDDEN_CALLS and not (name == "load" and base in ("json", "tomllib")) \
                        and not (name == "compile" and base == "re"):
                    found.append(f"{f.name}:{node.lineno} calls {base + '.' if base else ''}{name}")
    # The one jinja environment: the sandboxed one, whose templates come from the model folder only.
    chat_template = (package / "text" / "chat_template.py").read_text()
    assert "ImmutableSandboxedEnvironment(" in chat_template
    allowed = {f for f in found if f.startswith("chat_template.py") and "from_string" in f}
    assert set(found) - allowed == set(), found
