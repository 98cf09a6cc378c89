"""server/grpc/wire.py: request bytes that do not decode are refused naming the field; and who a peer is
(server/clients.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvllm.server.clients import client_key
from nvllm.server.grpc.wire import (
    UndecodableRequest,
    decode_generate_request,
    decode_tokenize_request,
    locate_decode_error,
)
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


STRING_CASES = [
    (pb.GenerateRequest(request_id="MARK", prompt="hi"), "request_id"),
    (pb.GenerateRequest(model="MARK", prompt="hi"), "model"),
    (pb.GenerateRequest(prompt="a MARK b"), "prompt"),
    (chat(("user", "hi"), ("assistant", "MARK")), "chat.messages[1].content"),
    (chat(("MARK", "hi")), "chat.messages[0].role"),
    (chat(("system", "s"), ("user", "u"), ("MARK", "a")), "chat.messages[2].role"),
    (pb.GenerateRequest(prompt="hi", sampling_params=pb.SamplingParams(stop=["a", "b", "xMARK"], max_tokens=3)),
     "sampling_params.stop[2]"),
    (pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]),
                        sampling_params=pb.SamplingParams(stop=["MARK"])), "sampling_params.stop[0]"),
    (pb.GenerateRequest(prompt="hi", structured=pb.StructuredOutput(json_schema='{"enum": ["MARK"]}')),
     "structured.json_schema"),
    (pb.GenerateRequest(prompt="hi", structured=pb.StructuredOutput(regex="MARK")), "structured.regex"),
    (pb.GenerateRequest(prompt="hi", structured=pb.StructuredOutput(choice=pb.Choice(choices=["a", "MARK"]))),
     "structured.choice.choices[1]"),
    (pb.GenerateRequest(prompt="hi", structured=pb.StructuredOutput(grammar='start: "MARK"')), "structured.grammar"),
    (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")]),
                        chat_template_kwargs='{"MARK": 1}'), "chat_template_kwargs"),
    (pb.GenerateRequest(prompt="hi", sampling_params=pb.SamplingParams(context_overflow="MARK")),
     "sampling_params.context_overflow"),
    (pb.GenerateRequest(prompt="hi", keep_alive="MARK"), "keep_alive"),
    *[(pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi"), pb.ChatMessage(
        role="assistant", tool_calls=[pb.ToolCall(id="c", name="f", arguments="{}"),
                                      pb.ToolCall(**{"id": "c2", "name": "f", "arguments": "{}", key: "xMARK"})])])),
       f"chat.messages[1].tool_calls[1].{key}") for key in ("id", "name", "arguments")],
    (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="tool", content="1", tool_call_id="MARK")])),
     "chat.messages[0].tool_call_id"),
    (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="tool", content="1", name="MARK")])),
     "chat.messages[0].name"),
    *[(pb.GenerateRequest(chat=chat(("user", "hi")).chat,
                          tools=[pb.Tool(name="f"), pb.Tool(**{"name": "g", key: "MARK"})]), f"tools[1].{key}")
      for key in ("name", "description", "parameters")],
    (pb.GenerateRequest(prompt="hi", tool_choice=pb.ToolChoice(function_name="MARK")), "tool_choice.function_name"),
]


def string_field_paths(descriptor, prefix: str = "") -> set[str]:
    """Every string field reachable from a message, as a path without indices."""
    paths = set()
    for field in descriptor.fields:
        if field.type == field.TYPE_STRING:
            paths.add(prefix + field.name)
        elif field.type == field.TYPE_MESSAGE:
            paths |= string_field_paths(field.message_type, prefix + field.name + ".")
    return paths


def test_the_cases_cover_every_string_field_of_the_request() -> None:
    covered = {re.sub(r"\[\d+\]", "", path) for _, path in STRING_CASES}
    assert covered == string_field_paths(pb.GenerateRequest.DESCRIPTOR)


def test_the_bytes_mirror_stays_out_of_the_pool_reflection_serves() -> None:
    from google.protobuf import descriptor_pool

    from nvllm.server.grpc import wire

    mirror_file = wire._MIRRORS.FindMessageTypeByName("nvllm.v1.GenerateRequest").file.name
    assert mirror_file != pb.DESCRIPTOR.name
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindFileByName(mirror_file)
    served = descriptor_pool.Default().FindMessageTypeByName("nvllm.v1.GenerateRequest")
    assert served.fields_by_name["prompt"].type == served.fields_by_name["prompt"].TYPE_STRING


@pytest.mark.parametrize("req, path", STRING_CASES)
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


def test_the_first_bad_field_in_field_number_order_is_named() -> None:
    data = with_bytes(pb.GenerateRequest(model="MARK", prompt="hi"), b"\xff" * 4)
    data += with_bytes(pb.GenerateRequest(request_id="MARK"), b"\xfe" * 4)   # on the wire last, number 1
    assert locate_decode_error(data)[0] == "request_id"


def test_a_bad_string_overwritten_on_the_wire_is_still_refused() -> None:
    # The mirror keeps only the last value of a field, so the bad one cannot be named, but the
    # request is refused all the same rather than raising.
    data = with_bytes(pb.GenerateRequest(prompt="MARK"), b"\xff" * 4)
    data += pb.GenerateRequest(prompt="ok").SerializeToString()
    out = decode_generate_request(data)
    assert isinstance(out, UndecodableRequest) and out.field == "request"


def test_broken_framing_is_refused_as_malformed() -> None:
    data = pb.GenerateRequest(request_id="abc", prompt="hello world").SerializeToString()
    for broken in (data[:-3], b"\x0a", b"\x00\x01", b"\x0b", b"\x08\xff"):
        assert locate_decode_error(broken) == ("request", "malformed protobuf encoding"), broken
    out = decode_generate_request(data[:-3])
    assert isinstance(out, UndecodableRequest) and out.message.startswith("request: malformed protobuf encoding")


def test_every_truncation_of_a_request_decodes_or_is_refused() -> None:
    req = chat(("system", "be brief"), ("user", "héllo"))
    req.request_id, req.model = "r-1", "m"
    req.sampling_params.CopyFrom(pb.SamplingParams(temperature=0.5, stop=["x", "yz"], stop_token_ids=[7, 300]))
    data = req.SerializeToString()
    refused = 0
    for n in range(len(data)):
        out = decode_generate_request(data[:n])
        if isinstance(out, UndecodableRequest):
            refused += 1
            assert out.field == "request" and "malformed protobuf encoding" in out.message
    assert refused > 0
    assert decode_generate_request(data) == req


def check_decoded(out: object) -> None:
    assert isinstance(out, (pb.GenerateRequest, UndecodableRequest))
    if isinstance(out, UndecodableRequest):
        root = re.split(r"[.\[]", out.field)[0]
        assert root == "request" or root in pb.GenerateRequest.DESCRIPTOR.fields_by_name
        assert out.message.startswith(out.field + ": ")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_decode_never_raises_on_random_bytes(data: bytes) -> None:
    check_decoded(decode_generate_request(data))


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(STRING_CASES), raw=st.binary(min_size=4, max_size=4),
       cut=st.integers(0, 200), junk=st.binary(max_size=8))
def test_random_bytes_in_a_string_field(case: tuple, raw: bytes, cut: int, junk: bytes) -> None:
    req, path = case
    data = with_bytes(req, raw)
    out = decode_generate_request(data)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert isinstance(out, UndecodableRequest) and out.field == path
    else:
        assert isinstance(out, pb.GenerateRequest)
    check_decoded(decode_generate_request(data[:cut] + junk + data[cut:]))


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


def test_logit_bias_map_becomes_a_dict_of_ints():
    from nvllm.server.grpc.generate_request import sampling_params_from_proto
    req = pb.GenerateRequest(prompt="x", sampling_params=pb.SamplingParams(logit_bias={7: 2.5, 3: -100.0}))
    assert sampling_params_from_proto(req).logit_bias == {7: 2.5, 3: -100.0}


def test_the_windows_map_by_name_and_unset_stays_unset():
    from nvllm.server.grpc.generate_request import sampling_params_from_proto
    req = pb.GenerateRequest(prompt="x", sampling_params=pb.SamplingParams(penalty_last_n=0, context_limit=100))
    params = sampling_params_from_proto(req)
    assert params.penalty_last_n == 0 and params.context_limit == 100     # 0 is a value: no penalty at all
    unset = sampling_params_from_proto(pb.GenerateRequest(prompt="x", sampling_params=pb.SamplingParams()))
    assert unset.penalty_last_n is None and unset.context_limit is None


@pytest.mark.parametrize("req, path", [
    (pb.TokenizeRequest(prompt="a MARK b"), "prompt"),
    (pb.TokenizeRequest(model="MARK", prompt="hi"), "model"),
    (pb.TokenizeRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="MARK")])),
     "chat.messages[0].content"),
])
def test_a_tokenize_request_that_does_not_decode_names_its_field(req: pb.TokenizeRequest, path: str) -> None:
    out = decode_tokenize_request(with_bytes(req, b"\xff\xfe\xfd\xfc"))
    assert isinstance(out, UndecodableRequest) and out.field == path
    assert out.message.startswith(f"{path}: must be valid UTF-8")
    assert locate_decode_error(b"\x0a\x05ab", pb.TokenizeRequest)[0] == "request"   # truncated
