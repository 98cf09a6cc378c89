"""Every repository path docs/DESIGN.md and README.md name in backticks exists, so the map never sends a
reader to a file that moved.

A span names a path when it contains a / or ends in .py, .c, .h, .md, .toml or .sh (a command's words are
read one by one). DESIGN.md abbreviates: `csrc/attention.c`, `kernels/prefill.py`, `weights/`, `answer.py`
are read inside the rooms they name, so a relative name resolves from the repository's root, from
daemon/nvllm/ and its layers, or else by the tree holding a file or folder that ends so. A module without
its .py (`assembly/factory`) and a name in a module (`kernels/matmul.set_activations`) name the module. A
glob (`dot_*.c`) must match something. Not repository paths: an HTTP route or a system path (a leading
/), a placeholder or a tag (<, {, $, ~), and what lies outside the tree (OUTSIDE: the venv the README
makes, a file in a setting's folder). Build output and other ignored files do not count as there.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from helpers.paths import ROOT

DOCS = ("docs/DESIGN.md", "README.md")
ENDINGS = (".py", ".c", ".h", ".md", ".toml", ".sh")
# where a relative name is read from before the tree is searched: the root, the package, its layers
BASES = ("", "daemon/", "daemon/nvllm/", "daemon/nvllm/model/", "daemon/nvllm/engine/", "daemon/nvllm/server/")
# not in the repository: the virtual environment the README's setup makes, a file under a setting's folder
OUTSIDE = (".venv/", "persist_dir/")


@cache
def tree() -> tuple[frozenset[str], frozenset[str]]:
    """(files, folders) of the working tree that git does not ignore, relative to the root."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    files = frozenset(f for f in listed if (ROOT / f).exists())
    folders = frozenset(str(p) for f in files for p in Path(f).parents if str(p) != ".")
    return files, folders


def spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text (fenced blocks left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def named_paths(text: str) -> list[str]:
    """What the text's code spans name that looks like a repository path, each once, in order."""
    found: list[str] = []
    for span in spans(text):
        for word in span.split():
            word = word.strip("\"'(),:;")
            if not ("/" in word or word.endswith(ENDINGS)) or word in found:
                continue
            if word.startswith("/") or "://" in word or any(c in word for c in "<>{}$~|") or word.startswith(OUTSIDE):
                continue
            found.append(word)
    return found


def _exists(name: str) -> bool:
    files, folders = tree()
    name = name.rstrip("/")
    if any(c in name for c in "*?["):
        return any(fnmatch.fnmatch(f, pattern) for pattern in (name, "*/" + name) for f in files)
    return any(base + name in files or base + name in folders for base in BASES) or \
        any(f.endswith("/" + name) or f == name for f in files | folders)


def resolves(name: str) -> bool:
    """Whether name is a file or folder of the tree (see the module's docstring)."""
    if _exists(name) or _exists(name + ".py"):
        return True
    head, _, last = name.rpartition("/")
    if "." in last:   # a name in a module: kernels/matmul.set_activations, model/decoder.Model.from_dir
        module = f"{head}/{last.split('.')[0]}" if head else last.split(".")[0]
        if _exists(module + ".py"):
            return True
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_doc_names_exists(doc: str) -> None:
    names = named_paths((ROOT / doc).read_text(encoding="utf-8"))
    assert names, f"{doc} names no path: the reading of its spans is broken"
    missing = [n for n in names if not resolves(n)]
    assert missing == [], f"{doc} names paths that do not exist: {missing}"


def test_the_reading_finds_paths_and_leaves_the_rest() -> None:
    text = ("`engine/scheduler.py` `csrc/attention.c` `kernels/matmul.set_activations` `dot_*.c` `structured/`"
            " `/v1/embeddings` `</think>` `model.activations` `python tools/gen_proto.py --x`")
    assert named_paths(text) == ["engine/scheduler.py", "csrc/attention.c", "kernels/matmul.set_activations",
                                 "dot_*.c", "structured/", "tools/gen_proto.py"]
    assert all(resolves(n) for n in named_paths(text))
    assert not resolves("engine/no_such_room/") and not resolves("csrc/no_such.c")
