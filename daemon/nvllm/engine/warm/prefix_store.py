"""The prefix cache on disk (cache.persist_dir): pages written at drain, read back at the next start.

One file, FILE_NAME in the directory:

    MAGIC (8 bytes) | header length (u64, little-endian) | header (JSON) | pages | blake2b-256 of all before

The header holds the model's identity (its files' names, sizes and mtimes, its shape, how its weights
are held: anything that changes the keys and values), the KV format (the pool's element type, block
size, layers, heads, a page's bytes) and each page's block hash and tokens: the pinned pages first, then
the others from least to most recently used, so the cache read back evicts in the order it would have.
A page is the pool's bytes of one block in every layer ([L, 2, block_size, heads, width]).

Reading checks everything before a page is used: the header's length against the file's (so a bad one
never sizes an allocation), its fields against this engine, the file's length against the pages it
lists, then the digest over the whole file; only then are pages installed, each into a free page (none
is evicted for it) as a cached block. The work is cut into steps (`advance`) the engine thread runs
between its batches. Any mismatch or damage: one log line, and the file is ignored.

Writing goes to a temporary file, synced, then renamed over the old one: a crash mid-drain leaves the
old file or none, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.engine.block_manager import BlockManager
from nvllm.model.kv_cache import KVCache

log = logging.getLogger("nvllm.engine.warm.prefix_store")

FILE_NAME = "prefix-cache.nvkv"
MAGIC = b"NVKVPC1\n"
VERSION = 1
_LEN = struct.Struct("<Q")
DIGEST_BYTES = 32
MAX_HEADER_BYTES = 64 << 20       # far above any real header (tokens of a few thousand pages)
VERIFY_CHUNK = 8 << 20            # bytes hashed per step while checking the file
INSTALL_BYTES = 16 << 20          # page bytes installed per step


class StoreMismatch(ValueError):
    """The file is not for this engine, or is damaged; the message says which and how."""


def model_identity(path: Path, shape: dict[str, Any]) -> dict[str, Any]:
    """What the cached keys and values depend on: the model's files (name, size, mtime) and `shape`
    (architecture, sizes, how the weights are held), as the header stores it."""
    path = path.resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    stats = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    return {"path": str(path), "files": stats, **shape}


def kv_layout(kv: KVCache) -> dict[str, Any]:
    """The pool's format as the header stores it."""
    return {"format": kv.format.name, "dtype": str(kv.pool.dtype), "block_size": kv.block_size,
            "page_shape": list(_page_shape(kv)), "page_bytes": page_bytes(kv)}


def _page_shape(kv: KVCache) -> tuple[int, ...]:
    s = kv.pool.shape
    return (s[0], s[1], *s[3:])


def page_bytes(kv: KVCache) -> int:
    return int(np.prod(_page_shape(kv))) * kv.pool.dtype.itemsize


# -- writing ------------------------------------------------------------------------------------
def select_pages(bm: BlockManager, pinned: list[int], max_bytes: int, per_page: int) -> list[int]:
    """The pages to write: every pinned one, then the most recently used cached ones while the file
    stays within max_bytes; written pinned first, the rest least recently used first."""
    chosen = list(dict.fromkeys(pinned))
    room = max(0, max_bytes // max(1, per_page) - len(chosen))
    taken = set(chosen)
    hot = [b for b in reversed(bm.evictable) if b not in taken][:room]
    return chosen + hot[::-1]


def write_store(path: Path, identity: dict[str, Any], kv: KVCache, bm: BlockManager, pages: list[int],
                num_pinned: int) -> int:
    """Write `pages` (cached or held, each with its hash) to path atomically; the bytes written."""
    header = {"version": VERSION, "model": identity, "kv": kv_layout(kv), "num_pinned": num_pinned,
              "blocks": [[bm.block_hashes[b].hex(), list(bm.block_tokens[b])]   # type: ignore[union-attr, arg-type]
                         for b in pages]}
    head = json.dumps(header, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    try:
        with open(tmp, "wb") as f:
            for part in (MAGIC, _LEN.pack(len(head)), head):
                digest.update(part)
                f.write(part)
            for b in pages:
                data = kv.pool[:, :, b].tobytes()
                digest.update(data)
                f.write(data)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:   # the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return size


# -- reading ------------------------------------------------------------------------------------
def _check_header(header: Any, identity: dict[str, Any], layout: dict[str, Any], vocab: int) -> None:
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise StoreMismatch(f"not a version {VERSION} header")
    for part, ours, what in (("model", identity, "model"), ("kv", layout, "KV format")):
        theirs = header.get(part)
        if theirs != ours:
            theirs = theirs if isinstance(theirs, dict) else {}
            key = next((k for k in ours if theirs.get(k) != ours[k]), part)
            raise StoreMismatch(f"written for another {what} ({key}: {_short(theirs.get(key))}, now "
                                f"{_short(ours.get(key))})")
    blocks, pinned, bs = header.get("blocks"), header.get("num_pinned"), layout["block_size"]
    if not isinstance(blocks, list) or not isinstance(pinned, int) or not 0 <= pinned <= len(blocks):
        raise StoreMismatch("malformed header (blocks, num_pinned)")
    for entry in blocks:
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and \
            len(entry[0]) in (32, 36) and _is_hex(entry[0]) and isinstance(entry[1], list) and len(entry[1]) == bs and \
            all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in entry[1])
        if not ok:
            raise StoreMismatch("malformed header (a block's hash or tokens)")


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class StoreLoad:
    """Reading the file back into the pool, a bounded share of the work per advance()."""

    def __init__(self, path: Path, identity: dict[str, Any], kv: KVCache, bm: BlockManager, vocab: int) -> None:
        self.path, self.identity, self.kv, self.bm, self.vocab = path, identity, kv, bm, vocab
        self.phase = "open"          # open -> verify -> install -> done
        self.num_pinned = 0
        self.num_installed = 0       # pages put in the pool (blocks already cached are not counted)
        self.num_done = 0            # blocks of the file dealt with
        self._blocks: list[list[Any]] = []
        self._file: Any = None
        self._data_at = 0
        self._pos = 0
        self._end = 0
        self._digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        self._t0 = time.monotonic()

    @property
    def past_pinned(self) -> bool:
        """The file's pinned pages are in the pool (or the file gave none)."""
        return self.phase == "done" or (self.phase == "install" and self.num_done >= self.num_pinned)

    @property
    def waiting(self) -> bool:
        """Out of free pages while the pool is still being backed: more come without a step."""
        bm = self.bm
        return self.phase == "install" and not bm.free_ids and bm.num_backed_blocks < bm.num_blocks

    def advance(self) -> bool:
        """One share of the work; False once the load is over (done, or given up with a log line)."""
        try:
            if self.phase == "open":
                self._open()
            elif self.phase == "verify":
                self._verify()
            elif self.phase == "install":
                self._install()
        except StoreMismatch as e:
            self._end_with(f"prefix cache {self.path} ignored: {e}", logging.WARNING)
        except (OSError, ValueError, MemoryError) as e:
            self._end_with(f"prefix cache {self.path} ignored: {type(e).__name__}: {e}", logging.WARNING)
        return self.phase != "done"

    def _end_with(self, line: str, level: int = logging.INFO) -> None:
        log.log(level, "%s", line)
        self.phase = "done"
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> None:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            self._end_with(f"prefix cache: no {self.path} yet (the drain writes it)")
            return
        self._file = f
        size = os.fstat(f.fileno()).st_size
        fixed = len(MAGIC) + _LEN.size
        if size < fixed + DIGEST_BYTES or f.read(len(MAGIC)) != MAGIC:
            raise StoreMismatch("not a prefix cache file (too short, or no magic)")
        (head_len,) = _LEN.unpack(f.read(_LEN.size))
        if head_len > min(MAX_HEADER_BYTES, size - fixed - DIGEST_BYTES):
            raise StoreMismatch(f"header of {head_len} bytes in a file of {size}: truncated or damaged")
        head = f.read(head_len)
        try:
            header = json.loads(head)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise StoreMismatch("header is not JSON: damaged") from None
        layout = kv_layout(self.kv)
        _check_header(header, self.identity, layout, self.vocab)
        self._blocks, self.num_pinned = header["blocks"], header["num_pinned"]
        self._data_at = fixed + head_len
        expected = self._data_at + len(self._blocks) * layout["page_bytes"] + DIGEST_BYTES
        if size != expected:
            raise StoreMismatch(f"{size} bytes where {len(self._blocks)} pages make {expected}: "
                                f"truncated or damaged")
        self._digest.update(MAGIC + _LEN.pack(head_len) + head)
        self._pos, self._end = self._data_at, size - DIGEST_BYTES
        self.phase = "verify"

    def _verify(self) -> None:
        n = min(VERIFY_CHUNK, self._end - self._pos)
        data = os.pread(self._file.fileno(), n, self._pos)
        if len(data) != n:
            raise StoreMismatch("shorter than when it was opened")
        self._digest.update(data)
        self._pos += n
        if self._pos < self._end:
            return
        if os.pread(self._file.fileno(), DIGEST_BYTES, self._end) != self._digest.digest():
            raise StoreMismatch("digest mismatch: damaged")
        self.phase = "install"

    def _install(self) -> None:
        per = page_bytes(self.kv)
        shape, dtype, pool = _page_shape(self.kv), self.kv.pool.dtype, self.kv.pool
        budget = max(1, INSTALL_BYTES // per)
        while budget and self.num_done < len(self._blocks):
            h_hex, tokens = self._blocks[self.num_done]
            h = bytes.fromhex(h_hex)
            if h not in self.bm.hash_to_block:
                if not self.bm.free_ids:
                    if self.bm.num_backed_blocks < self.bm.num_blocks:
                        return   # the pool is still being backed: go on when it has more
                    break
                data = os.pread(self._file.fileno(), per, self._data_at + self.num_done * per)
                page = np.frombuffer(data, dtype=dtype).reshape(shape)

                def write(b: int, page: np.ndarray = page) -> None:
                    pool[:, :, b] = page
                if self.bm.add_cached(h, tuple(tokens), write) is not None:
                    self.num_installed += 1
                budget -= 1
            self.num_done += 1
        left = len(self._blocks) - self.num_done
        if left and self.num_done < len(self._blocks) and budget:
            self._end_with(f"prefix cache: {self.num_installed} pages read back from {self.path}, "
                           f"{left} left out (no free page)")
        elif not left:
            self._end_with(f"prefix cache: {self.num_installed} of {len(self._blocks)} pages read back "
                           f"from {self.path} in {time.monotonic() - self._t0:.2f} s "
                           f"({self.num_pinned} pinned when written)")
