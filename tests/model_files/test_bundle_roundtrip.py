"""A tiny model exported and imported elsewhere: the same bytes, read by nvllm's GGUF reader and served by the
offline engine; a second import leaves it; a new version replaces it by rename while a reader of the old file
keeps the old bytes; and the command line end to end (keygen, export, sign, import from a file and stdin)."""

from __future__ import annotations

import json
import mmap
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import IO

import pytest

from helpers.bundles import make_models, state
from helpers.gguf_util import write_gguf
from nvllm.model_files.bundle_export import export_bundle, resolve_model
from nvllm.model_files.bundle_import import import_bundle
from nvllm.model_files.bundle_manifest import MANIFEST_NAME, BundleError, parse_manifest
from nvllm.model_files.listing import describe_folder, describe_gguf


@pytest.fixture(scope="module")
def shelf(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder with tiny-llama as a GGUF and tiny-qwen2 as a folder (two safetensors shards)."""
    d = tmp_path_factory.mktemp("shelf")
    write_gguf(tiny_models["tiny-llama"], d / "tiny-llama.gguf")
    shutil.copytree(tiny_models["tiny-qwen2"], d / "tiny-qwen2")
    return d


def test_round_trip_gives_the_same_bytes_and_a_model_nvllm_reads(shelf: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    data = export_bundle(["tiny-llama", "tiny-qwen2"], bundle, shelf)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        assert names[0] == MANIFEST_NAME
        assert tar.extractfile(names[0]).read() == data            # type: ignore[union-attr]
    manifest = parse_manifest(data)
    assert [(m.name, m.kind) for m in manifest.models] == [("tiny-llama", "gguf"), ("tiny-qwen2", "folder")]
    assert names[1:] == list(manifest.members())

    board = tmp_path / "board"
    done = import_bundle(bundle, board)
    assert [(m.name, m.action) for m in done] == [("tiny-llama", "installed"), ("tiny-qwen2", "installed")]
    assert state(board / "tiny-qwen2") == state(shelf / "tiny-qwen2")
    assert (board / "tiny-llama.gguf").read_bytes() == (shelf / "tiny-llama.gguf").read_bytes()
    row = describe_gguf(board / "tiny-llama.gguf")
    assert row["complete"] and row["error"] is None and row["architecture"] == "llama"
    assert describe_folder(board / "tiny-qwen2")["complete"]
    assert sorted(p.name for p in board.iterdir()) == ["tiny-llama.gguf", "tiny-qwen2"]   # no staging left

    from nvllm import LLM, SamplingParams
    out = LLM(board / "tiny-llama.gguf", num_blocks=32).generate(
        "The quick brown fox", SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out[0].token_ids) == 4

    assert {m.action for m in import_bundle(bundle, board)} == {"unchanged"}


def test_a_new_version_replaces_the_old_by_rename(tmp_path: Path) -> None:
    old, new = make_models(tmp_path / "old", seed=1), make_models(tmp_path / "new", seed=2)
    board = tmp_path / "board"
    shutil.copytree(old, board)
    bundle = tmp_path / "b.tar"
    export_bundle(["a", "fold"], bundle, new)
    with open(board / "a.gguf", "rb") as f, open(board / "fold" / "sub" / "w.bin", "rb") as g:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)    # as a serving daemon maps its GGUF
        assert [m.action for m in import_bundle(bundle, board)] == ["replaced", "replaced"]
        assert mapped[:] == (old / "a.gguf").read_bytes()                 # the old bytes, still mapped
        assert g.read() == (old / "fold" / "sub" / "w.bin").read_bytes()
        mapped.close()
    assert state(board) == state(new)


def test_names_resolve_in_the_models_folder_or_as_paths(tmp_path: Path) -> None:
    d = make_models(tmp_path / "models")
    (d / "fold.gguf").write_bytes(b"GGUF")
    assert resolve_model("a", d)[:2] == ("a", "gguf")
    assert resolve_model("a.gguf", d)[:2] == ("a", "gguf")
    with pytest.raises(BundleError, match="give fold.gguf or fold/"):
        resolve_model("fold", d)
    assert resolve_model("fold/", d)[:2] == ("fold", "folder")
    assert resolve_model(str(d / "fold"), tmp_path)[:2] == ("fold", "folder")
    with pytest.raises(BundleError, match="no model"):
        resolve_model("missing", d)


def cli(*args: str, stdin: IO[bytes] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", "models", *args], capture_output=True, text=True,
                          stdin=stdin, cwd=cwd, timeout=120)


def test_command_line_end_to_end(tmp_path: Path) -> None:
    src = make_models(tmp_path / "src")
    r = cli("keygen", "--out", str(tmp_path / "fleet"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2].startswith("SHA256:")
    bundle = tmp_path / "b.tar"
    r = cli("export", "a", "fold", "--out", str(bundle), "--dir", str(src), "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == str(bundle), r.stderr
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name]
    r = cli("sign", str(bundle), "--key", str(tmp_path / "fleet"))
    assert r.returncode == 0 and r.stdout.strip() == str(bundle) + ".sig", r.stderr

    config = tmp_path / "nvllm.toml"
    board = tmp_path / "board"
    config.write_text(f'[model]\nmodels_dir = "{board}"\n[bundles]\ntrusted_keys = ["{tmp_path}/fleet.pub"]\n'
                      "require_signature = true\n")
    r = cli("import", str(bundle), "--config", str(config), "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["installed", "a", f"{board}/a.gguf", "installed", "fold", f"{board}/fold"]
    assert state(board) == state(src)

    # another bundle, carried with this one's signature: refused with one line, the board as it was
    other = tmp_path / "other.tar"
    assert cli("export", "a", "--out", str(other), "--dir", str(make_models(tmp_path / "v2", seed=5)),
               "--quiet").returncode == 0
    r = cli("import", str(other), "--config", str(config), "--signature", str(bundle) + ".sig")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "signature does not verify" in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("; nothing installed")
    assert state(board) == state(src)
    r = cli("import", str(other), "--config", str(config))
    assert r.returncode == 1 and "unsigned" in r.stderr, r.stderr

    # streamed: export to stdout, import from stdin; signed at export with --key
    with open(tmp_path / "piped.tar", "wb") as f:
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "models", "export", "a", "fold", "--out", "-",
                            "--dir", str(make_models(tmp_path / "v4", seed=4)), "--quiet"], stdout=f, timeout=120)
    assert r.returncode == 0
    signed = tmp_path / "signed.tar"
    r = cli("export", "a", "fold", "--out", str(signed), "--dir", str(make_models(tmp_path / "v3", seed=3)),
            "--quiet", "--key", str(tmp_path / "fleet"))
    assert r.returncode == 0 and (tmp_path / "signed.tar.sig").is_file(), r.stderr
    with open(tmp_path / "piped.tar", "rb") as f:       # v4's files, v3's signature
        r = cli("import", "-", "--dir", str(board), "--trusted-key", str(tmp_path / "fleet.pub"),
                "--require-signature", "--signature", str(signed) + ".sig", stdin=f)
    assert r.returncode == 1 and "signature does not verify" in r.stderr, r.stderr
    with open(signed, "rb") as f:
        r = cli("import", "-", "--dir", str(board), "--trusted-key", str(tmp_path / "fleet.pub"),
                "--require-signature", "--signature", str(signed) + ".sig", stdin=f)
    assert r.returncode == 0, r.stderr
    assert state(board) == state(tmp_path / "v3")
    assert json.loads(Path(str(signed) + ".sig").read_text())["algorithm"] == "ed25519"
