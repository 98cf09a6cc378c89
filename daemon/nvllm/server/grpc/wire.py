"""Requests off the wire (GenerateRequest, TokenizeRequest): a decode failure becomes a refusal that names
the field.

gRPC's generated handler decodes with `GenerateRequest.FromString`; when that raises (a proto3
string field holding bytes that are not UTF-8, a truncated message) the servicer never runs and the
client gets UNKNOWN "Unexpected DecodeError". `decode_generate_request` is used instead: it returns
an `UndecodableRequest` carrying the field's path ("chat.messages[1].content",
"sampling_params.stop[0]") and the reason, which the servicer turns into INVALID_ARGUMENT.

Finding the field parses the bytes again as a mirror of the request whose string fields are
declared `bytes` (protobuf accepts any bytes there) and looks for the first one that is not UTF-8.
The mirror is built at import from the real descriptor, so it cannot fall behind nvllm.proto, and
lives in a private descriptor pool, so gRPC reflection never serves it. Nothing here is on the path
of a request that decodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from nvllm.v1 import nvllm_pb2 as pb


@dataclass(frozen=True)
class UndecodableRequest:
    """What the handler gets instead of a request whose bytes did not decode."""

    field: str
    message: str


def _strings_to_bytes(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for message in messages:
        for field in message.field:
            if field.type == FieldDescriptor.TYPE_STRING:
                field.type = FieldDescriptor.TYPE_BYTES
        _strings_to_bytes(message.nested_type)


def _bytes_mirrors() -> descriptor_pool.DescriptorPool:
    file = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    file.name = "nvllm/v1/nvllm_bytes_mirror.proto"     # never served: the pool below is private
    file.ClearField("service")
    _strings_to_bytes(file.message_type)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool


# Same package and names as the real messages, so a mirror field's full_name finds the real field.
_MIRRORS = _bytes_mirrors()
_REAL_POOL = pb.DESCRIPTOR.pool


def decoder(real: type[Message]) -> Callable[[bytes], Message | UndecodableRequest]:
    """The request deserializer for `real` messages: the message, or an UndecodableRequest naming the field."""
    def decode(data: bytes) -> Message | UndecodableRequest:
        try:
            return real.FromString(data)
        except DecodeError as e:
            field, reason = locate_decode_error(data, real)
            return UndecodableRequest(field, f"{field}: {reason} (the request could not be decoded: {e})")
    return decode


decode_generate_request = decoder(pb.GenerateRequest)
decode_tokenize_request = decoder(pb.TokenizeRequest)
decode_embed_request = decoder(pb.EmbedRequest)
decode_rerank_request = decoder(pb.RerankRequest)


def locate_decode_error(data: bytes, real: type[Message] = pb.GenerateRequest) -> tuple[str, str]:
    """(field path, reason) for bytes that do not decode as a `real` message; ("request", ...) when the
    failure is not a string field's UTF-8."""
    name = real.DESCRIPTOR.full_name
    try:
        mirror = message_factory.GetMessageClass(_MIRRORS.FindMessageTypeByName(name)).FromString(data)
    except DecodeError:
        return "request", "malformed protobuf encoding"
    found = _first_non_utf8(mirror, "")
    if found is not None:
        return found, "must be valid UTF-8 (a proto3 string field)"
    return "request", f"not a valid {name}"


def _first_non_utf8(message: Message, prefix: str) -> str | None:
    """The path of the first set field, in field-number order, that was a string in the real
    message and holds bytes that are not UTF-8."""
    for field, value in message.ListFields():
        items = enumerate(value) if field.is_repeated else [(None, value)]
        for index, item in items:
            path = prefix + field.name + ("" if index is None else f"[{index}]")
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                found = _first_non_utf8(item, path + ".")
                if found is not None:
                    return found
            elif _REAL_POOL.FindFieldByName(field.full_name).type == FieldDescriptor.TYPE_STRING:
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    return path
    return None
