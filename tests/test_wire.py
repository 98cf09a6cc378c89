"""server/wire.py: request bytes that do not decode are refused naming the field; and who a peer is."""

from __future__ import annotations

import pytest

from nvllm.server.service import client_key
from nvllm.server.wire import UndecodableRequest, decode_generate_request, locate_decode_error
from nvllm.v1 import nvllm_pb2 as pb

MARK = b"MARK"


def with_bytes(req: pb.GenerateRequest, bad: bytes) -> bytes:
    data = req.SerializeToString()
    assert data.count(MARK) == 1
    return data.replace(MARK, bad)


def chat(*messages: tuple[str, str]) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    for role, content in messages:
        req.chat.messages.add(role=role, content=content)
    return req


@pytest.mark.parametrize("req, path", [
    (pb.GenerateRequest(request_id="MARK", prompt="hi"), "request_id"),
    (pb.GenerateRequest(model="MARK", prompt="hi"), "model"),
    (pb.GenerateRequest(prompt="a MARK b"), "prompt"),
    (chat(("user", "hi"), ("assistant", "MARK")), "chat.messages[1].content"),
    (chat(("MARK", "hi")), "chat.messages[0].role"),
    (pb.GenerateRequest(prompt="hi", sampling_params=pb.SamplingParams(stop=["a", "b", "xMARK"], max_tokens=3)),
     "sampling_params.stop[2]"),
])
@pytest.mark.parametrize("bad", [b"\xff\xfe\xfd\xfc", b"\xed\xa0\x80a", b"\xc0\xafab", b"\xf4\x90\x80\x80"])
def test_invalid_utf8_is_refused_naming_the_field(req: pb.GenerateRequest, path: str, bad: bytes) -> None:
    out = decode_generate_request(with_bytes(req, bad))
    assert isinstance(out, UndecodableRequest)
    assert out.field == path
    assert out.message.startswith(f"{path}: must be valid UTF-8")


def test_good_bytes_decode_as_usual_unknown_fields_included() -> None:
    req = pb.GenerateRequest(prompt="héllo", sampling_params=pb.SamplingParams(max_tokens=3))
    unknown = bytes([0xB8, 0x06, 0x07])            # field 103, varint 7: not in this version's proto
    out = decode_generate_request(req.SerializeToString() + unknown)
    assert isinstance(out, pb.GenerateRequest) and out.prompt == "héllo" and out.sampling_params.max_tokens == 3


def test_broken_framing_names_the_field_it_broke_in() -> None:
    data = pb.GenerateRequest(request_id="abc", prompt="hello world").SerializeToString()
    assert locate_decode_error(data[:-3])[0] == "prompt"                        # length runs past the end
    assert locate_decode_error(b"\x0a")[0] == "request_id"                        # the length is missing
    cut = chat(("user", "hello")).SerializeToString()[:-2]
    assert locate_decode_error(cut)[0].startswith("chat")
    out = decode_generate_request(data[:-3])
    assert isinstance(out, UndecodableRequest) and out.message.startswith("prompt: malformed protobuf encoding")
    assert locate_decode_error(b"\x00\x01")[0] == "request"                       # field number 0


@pytest.mark.parametrize("peer, key", [
    ("ipv4:127.0.0.1:51234", "127.0.0.1"),
    ("ipv4:10.0.0.7:1", "10.0.0.7"),
    ("ipv6:[::1]:51234", "::1"),
    ("ipv6:%5B::1%5D:51234", "::1"),
    ("ipv6:[::ffff:10.0.0.7]:51234", "10.0.0.7"),       # IPv4 on a dual-stack socket: the same host
    ("unix:/run/nvllm/nvllm.sock", "unix"),
    ("unix:", "unix"),
])
def test_client_key_is_the_address_without_the_port(peer: str, key: str) -> None:
    assert client_key(peer) == key
