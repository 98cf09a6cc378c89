"""GenerateRequest off the wire: a decode failure becomes a refusal that names the field.

gRPC's generated handler decodes with `GenerateRequest.FromString`; when that raises (a proto3
string field holding bytes that are not UTF-8, a truncated message) the servicer never runs and the
client gets UNKNOWN "Unexpected DecodeError". `decode_generate_request` is used instead: it returns
an `UndecodableRequest` carrying the field's path ("chat.messages[1].content",
"sampling_params.stop[0]") and the reason, which the servicer turns into INVALID_ARGUMENT.

Finding the field walks the protobuf wire format of the few messages involved; nothing here is on
the path of a request that decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from google.protobuf.message import DecodeError

from nvllm.v1 import nvllm_pb2 as pb

# Wire types (protobuf encoding).
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5

# message -> {field number: (name, kind)}; kind is "string", "varints" (packed repeated ints), or
# the nested message's own table. A name ending in [] is repeated (its index goes into the path).
_CHAT_MESSAGE = {1: ("role", "string"), 2: ("content", "string")}
_CHAT = {1: ("messages[]", _CHAT_MESSAGE)}
_TOKEN_IDS = {1: ("ids", "varints")}
_SAMPLING = {11: ("stop[]", "string"), 12: ("stop_token_ids", "varints")}
_REQUEST = {1: ("request_id", "string"), 2: ("model", "string"), 3: ("prompt", "string"),
            4: ("chat", _CHAT), 5: ("prompt_token_ids", _TOKEN_IDS), 6: ("sampling_params", _SAMPLING)}


@dataclass(frozen=True)
class UndecodableRequest:
    """What the handler gets instead of a GenerateRequest whose bytes did not decode."""

    field: str
    message: str


class _Malformed(Exception):
    pass


def decode_generate_request(data: bytes) -> Union[pb.GenerateRequest, UndecodableRequest]:
    try:
        return pb.GenerateRequest.FromString(data)
    except DecodeError as e:
        field, reason = locate_decode_error(data)
        return UndecodableRequest(field, f"{field}: {reason} (the request could not be decoded: {e})")


def locate_decode_error(data: bytes) -> tuple[str, str]:
    """(field path, reason) for bytes that do not decode as a GenerateRequest; ("request", ...)
    when the failure lies outside any field this module knows."""
    try:
        found = _walk(memoryview(data), _REQUEST, "")
    except _Malformed as e:
        return str(e) or "request", "malformed protobuf encoding"
    if found is not None:
        return found, "must be valid UTF-8 (a proto3 string field)"
    return "request", "not a valid nvllm.v1.GenerateRequest"


def _varint(data: memoryview, i: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise _Malformed(where)
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _walk(data: memoryview, table: dict, prefix: str) -> Optional[str]:
    """The path of the first string field with bytes that are not UTF-8; raises _Malformed (with
    the innermost known field's path) for broken framing."""
    counts: dict[int, int] = {}
    where = prefix.rstrip(".") or "request"
    i = 0
    while i < len(data):
        key, i = _varint(data, i, where)
        number, wire_type = key >> 3, key & 7
        entry = table.get(number)
        path = where
        if entry is not None:
            name, kind = entry
            if name.endswith("[]"):
                index = counts.get(number, 0)
                counts[number] = index + 1
                name = f"{name[:-2]}[{index}]"
            path = prefix + name
        if number == 0:
            raise _Malformed(where)
        if wire_type == _VARINT:
            _, i = _varint(data, i, path)
        elif wire_type == _I64 or wire_type == _I32:
            i += 8 if wire_type == _I64 else 4
            if i > len(data):
                raise _Malformed(path)
        elif wire_type == _LEN:
            n, i = _varint(data, i, path)
            if i + n > len(data):
                raise _Malformed(path)
            chunk, i = data[i:i + n], i + n
            if entry is None:
                continue
            kind = entry[1]
            if kind == "string":
                try:
                    str(chunk, "utf-8")
                except UnicodeDecodeError:
                    return path
            elif kind == "varints":
                j = 0
                while j < len(chunk):
                    _, j = _varint(chunk, j, path)
            else:
                found = _walk(chunk, kind, path + ".")
                if found is not None:
                    return found
        else:   # groups (3, 4) are not in proto3; 6 and 7 do not exist
            raise _Malformed(path)
    return None
