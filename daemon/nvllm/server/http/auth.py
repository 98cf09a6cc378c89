"""The API key: read once from http.api_key_file, compared in constant time with the Bearer token or,
as Anthropic's clients send it, the x-api-key header."""

from __future__ import annotations

import hmac
import logging
import os
import stat
from pathlib import Path

from nvllm.server.http.errors import ApiError

log = logging.getLogger("nvllm.server.http.auth")

MAX_KEY_FILE_BYTES = 4096


class KeyFileError(Exception):
    pass


def read_api_key(path: str) -> bytes:
    """The key in path (surrounding whitespace dropped); KeyFileError naming the file and what is wrong."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"http.api_key_file {path} is not a regular file")
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"http.api_key_file {path} is {st.st_size} bytes; a key file holds one key "
                               f"(at most {MAX_KEY_FILE_BYTES} bytes)")
        data = p.read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read http.api_key_file {path}: {e.strerror or e}") from None
    key = data.strip()
    if not key:
        raise KeyFileError(f"http.api_key_file {path} is empty: write the key into it")
    if any(b < 0x21 or b > 0x7e for b in key):
        raise KeyFileError(f"http.api_key_file {path}: the key must be printable ASCII without spaces "
                           "(it travels in an HTTP header)")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and os.name == "posix":
        log.warning("http.api_key_file %s is readable by other users (mode %o): chmod 600 it",
                    path, stat.S_IMODE(st.st_mode))
    return key


def check_key(expected: bytes | None, authorization: str | None, x_api_key: str | None = None) -> None:
    """ApiError 401 unless the Authorization header is "Bearer <expected>" or, with no Authorization
    header, the x-api-key header is the key (no key configured: pass)."""
    if expected is None:
        return
    if not authorization and x_api_key:
        if not hmac.compare_digest(x_api_key.strip().encode("utf-8", "replace"), expected):
            raise ApiError(401, "incorrect API key", code="invalid_api_key")
        return
    if not authorization:
        raise ApiError(401, "missing API key: send the header 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                       code="invalid_api_key")
    scheme, _, token = authorization.partition(" ")
    given = token.strip().encode("utf-8", "replace")
    # compare_digest takes as long whatever the first differing byte, so timing does not leak the key.
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, expected):
        raise ApiError(401, "incorrect API key", code="invalid_api_key")
