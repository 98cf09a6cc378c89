"""A stand-in for the Hugging Face Hub on 127.0.0.1: what huggingface_hub 2.5.0 asks of it for a pull.

- GET /api/models/{org}/{repo}[/revision/{rev}] (HfApi.model_info, ?blobs=True): the repository's files
  with their sizes, git blob ids and, for LFS files, their sha256 (`siblings`), and the commit (`sha`).
- HEAD and GET /{org}/{repo}/resolve/{rev}/{path}: X-Repo-Commit, ETag (an LFS file's sha256, else its
  blob id), X-Linked-Size and X-Linked-Etag for LFS files, Content-Length, and Range (206 with
  Content-Range) so that a cut download resumes.
- Errors as the Hub sends them: 404 with X-Error-Code RepoNotFound / EntryNotFound / RevisionNotFound, 401
  with GatedRepo for a gated repository's file without the token.

Faults, set on the object while it runs: `wrong_sha[(repo, path)]` lists a sha256 the bytes do not have;
`stall` (a set of (repo, path)) sends a file's headers and then nothing until the hub stops;
`cut[(repo, path)] = n` sends the first n bytes of the file and closes the connection (a request that starts
at or past n gets its connection closed before any answer); `broken` (a set of repositories) answers 500.
`requests` records (method, path, Range header) of each request. `hanging_endpoint()` gives the address of a
socket that accepts connections and never answers.

Use: `with FakeHub() as hub: hub.add_repo("org/name", {"f.gguf": b"..."}); env HF_ENDPOINT=hub.url`.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_MIN = 1024        # files at least this long are LFS files (sha256 listed); smaller ones are kept in git


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated_token: str = ""           # non-empty: gated, files need "Authorization: Bearer <token>"

    def sibling(self, path: str, listed_sha: str | None) -> dict[str, Any]:
        data = self.files[path]
        s: dict[str, Any] = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
        if len(data) >= LFS_MIN:
            s["lfs"] = {"size": len(data), "sha256": listed_sha or hashlib.sha256(data).hexdigest(),
                        "pointerSize": 134}
        return s


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    wrong_sha: dict[tuple[str, str], str] = field(default_factory=dict)
    cut: dict[tuple[str, str], int] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    stall: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._hang: socket.socket | None = None
        self.released = threading.Event()      # set at stop: stalled answers end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_repo(self, repo: str, files: dict[str, bytes], gated_token: str = "") -> Repo:
        r = Repo(dict(files), hashlib.sha1(repo.encode() + str(len(self.repos)).encode()).hexdigest(), gated_token)
        self.repos[repo] = r
        return r

    def add_folder(self, repo: str, folder: Path, extra: dict[str, bytes] | None = None) -> Repo:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_repo(repo, {**files, **(extra or {})})

    def hanging_endpoint(self) -> str:
        """A socket that takes connections into its backlog and never answers."""
        if self._hang is None:
            self._hang = socket.socket()
            self._hang.bind(("127.0.0.1", 0))
            self._hang.listen(16)
        return f"http://127.0.0.1:{self._hang.getsockname()[1]}"

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        if self._hang is not None:
            self._hang.close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_INFO = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    server_hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _error(self, status: int, code: str = "", message: str = "") -> None:
        body = json.dumps({"error": message or code or "error"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, body: bool) -> None:
        hub = self.server_hub
        path = unquote(urlsplit(self.path).path)
        hub.requests.append((self.command, path, self.headers.get("Range", "")))
        if path == "/api/agent-harnesses":      # the library's agent registry: none here
            return self._json({"standardEnvVars": [], "harnesses": {}}, body)
        m = _INFO.match(path)
        if m:
            return self._info(m.group(1), m.group(2), body)
        m = _RESOLVE.match(path)
        if m:
            return self._file(m.group(1), m.group(2), m.group(3), body)
        self._error(404, message="no such endpoint")

    def _repo(self, name: str) -> Repo | None:
        hub = self.server_hub
        if name in hub.broken:
            self._error(500, message="Internal Error")
            return None
        repo = hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _info(self, name: str, rev: str | None, body: bool) -> None:
        repo = self._repo(name)
        if repo is None:
            return
        if rev not in (None, "main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        hub = self.server_hub
        self._json({
            "id": name, "sha": repo.commit, "private": False, "gated": "manual" if repo.gated_token else False,
            "siblings": [repo.sibling(p, hub.wrong_sha.get((name, p))) for p in sorted(repo.files)],
        }, body)

    def _json(self, obj: object, body: bool) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _file(self, name: str, rev: str, path: str, body: bool) -> None:
        repo = self._repo(name)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        if path not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found")
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self._error(401, "GatedRepo", "Access to this model is restricted")
        data = repo.files[path]
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if rng:
            start = min(int(rng.group(1)), len(data))
        cut = self.server_hub.cut.get((name, path))
        if cut is not None and start >= cut:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        sha = hashlib.sha256(data).hexdigest()
        etag = sha if len(data) >= LFS_MIN else git_blob_id(data)
        self.send_response(206 if rng else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if len(data) >= LFS_MIN:
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if not body:
            return
        if (name, path) in self.server_hub.stall:
            self.wfile.flush()
            self.server_hub.released.wait(30)
            self.close_connection = True
            return
        if cut is not None:
            self.wfile.write(data[start:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])
