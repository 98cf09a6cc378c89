"""A bundle streams: exporting and importing a 200 MB model grows the process's peak resident memory by a
few MiB (a chunk and the tar's buffer), not by the file's size, so a bundle larger than a board's memory
imports. Run in a fresh process, whose peak is its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SIZE = 200 << 20
CHILD = """
import resource, sys
from pathlib import Path
from nvllm.model_files.bundle_export import export_bundle
from nvllm.model_files.bundle_import import import_bundle

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

d = Path(sys.argv[1])
base = peak()
export_bundle(["big"], d / "b.tar", d / "models")
exported = peak()
done = import_bundle(d / "b.tar", d / "board")
assert [m.action for m in done] == ["installed"]
print(base, exported, peak())
"""


def test_a_bundle_larger_than_the_memory_it_may_use_streams(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with open(tmp_path / "models" / "big.gguf", "wb") as f:    # sparse, but every byte is read and written
        f.write(b"GGUF")
        f.truncate(SIZE)
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    base, exported, imported = map(int, r.stdout.split())
    assert exported - base < 24 << 20, (base, exported)
    assert imported - base < 24 << 20, (base, imported)
    assert os.path.getsize(tmp_path / "board" / "big.gguf") == SIZE
    assert os.path.getsize(tmp_path / "b.tar") > SIZE
