"""What a model's files are on disk, cheaply: each file's (name, inode, size, mtime), read by stat alone.

A new version put in place by rename (`nvllm models import`, a pull, an operator's `mv`) has a new inode; one
written over in place has a new size or mtime. Two readings that differ mean the files changed since the
first; SIGHUP reloads the loaded models whose files did (model_update.py), and the loader reads a model's
least size again (model_loader.py). A folder is read one level deep (its config, weights and tokenizer).
"""

from __future__ import annotations

import os
from pathlib import Path

FileSignature = tuple[tuple[str, int, int, int], ...]


def file_signature(path: Path) -> FileSignature:
    """The model's files as they are now; () when the path is missing or unreadable."""
    try:
        if path.is_dir():
            entries = sorted((e for e in os.scandir(path) if e.is_file() and not e.name.startswith(".")),
                             key=lambda e: e.name)
            stats = [(e.name, e.stat()) for e in entries]
        else:
            stats = [(path.name, path.stat())]
    except OSError:
        return ()
    return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns) for name, st in stats)
