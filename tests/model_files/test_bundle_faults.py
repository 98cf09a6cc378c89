"""A bad bundle is refused whole: cut short, a byte flipped, a member the manifest does not list, a path
leading out of its model, links and devices, sizes that disagree. Each refusal is one line naming the member
and the reason; the board's models folder is left exactly as it was (its older models untouched, no staging
folder left behind)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from helpers.bundles import Member, link, make_models, manifest_of, state, write_tar
from nvllm.model_files.bundle_export import export_bundle
from nvllm.model_files.bundle_import import import_bundle
from nvllm.model_files.bundle_manifest import BundleError

FILES = {"a.gguf": b"GGUF" + bytes(range(256)) * 40, "fold/config.json": b'{"x": 1}', "fold/w.bin": b"w" * 999}
MODELS = [("a", "gguf"), ("fold", "folder")]


@pytest.fixture()
def board(tmp_path: Path) -> Path:
    """A board's models folder already holding older a.gguf and fold (other bytes)."""
    return make_models(tmp_path / "board", seed=1)


@pytest.fixture()
def good(tmp_path: Path) -> Path:
    export_bundle(["a", "fold"], tmp_path / "good.tar", make_models(tmp_path / "src"))
    return tmp_path / "good.tar"


def refused(bundle: Path, board: Path, *words: str) -> str:
    before = state(board)
    with pytest.raises(BundleError) as e:
        import_bundle(bundle, board)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    assert state(board) == before
    return msg


def test_the_good_bundle_installs(good: Path, board: Path) -> None:
    (board / ".nvllm-import-999999999-0000" / "fold").mkdir(parents=True)   # left by an import killed midway
    assert [m.action for m in import_bundle(good, board)] == ["replaced", "replaced"]
    assert not [p for p in board.iterdir() if p.name.startswith(".")]
    assert [m.action for m in import_bundle(good, board)] == ["unchanged", "unchanged"]


def _cuts(bundle: Path) -> dict[str, int]:
    with tarfile.open(bundle) as tar:
        m = tar.getmembers()
    last = m[-1]
    return {"in the manifest": m[0].offset_data + 10, "in a header": m[1].offset + 100,
            "in a.gguf": m[1].offset_data + m[1].size // 2, "in the last file": last.offset_data + 100,
            "a byte short": last.offset_data + last.size - 1}


@pytest.mark.parametrize("where", ["in the manifest", "in a header", "in a.gguf", "in the last file",
                                   "a byte short"])
def test_a_bundle_cut_short_is_refused(good: Path, board: Path, tmp_path: Path, where: str) -> None:
    short = tmp_path / "short.tar"
    short.write_bytes(good.read_bytes()[:_cuts(good)[where]])
    msg = refused(short, board)
    assert any(w in msg for w in ("cut short", "missing from the bundle", "not a bundle")), msg


def test_a_bundle_without_its_end_blocks_still_checks_out(good: Path, board: Path, tmp_path: Path) -> None:
    # every member whole, each checked by its sha256: only the tar's two zero blocks are missing
    with tarfile.open(good) as tar:
        last = tar.getmembers()[-1]
    short = tmp_path / "short.tar"
    short.write_bytes(good.read_bytes()[:last.offset_data + -(-last.size // 512) * 512])
    assert [m.action for m in import_bundle(short, board)] == ["replaced", "replaced"]


def test_a_flipped_byte_is_refused(good: Path, board: Path, tmp_path: Path) -> None:
    # a.gguf and fold/config.json check out and are staged, then fold/sub/w.bin does not: nothing is installed
    data = bytearray(good.read_bytes())
    i = data.index((tmp_path / "src" / "fold" / "sub" / "w.bin").read_bytes()[:64])
    data[i + 10] ^= 1
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    refused(bad, board, "fold/sub/w.bin", "sha256")
    assert not [p for p in board.iterdir() if p.name.startswith(".")]


def test_a_member_not_in_the_manifest_is_refused(board: Path, tmp_path: Path) -> None:
    members = list(FILES.items()) + [("fold/extra.py", b"import os")]
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), members), board,
            "fold/extra.py", "not listed in the manifest")
    members = [("evil.gguf", b"x")] + list(FILES.items())
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), members), board, "evil.gguf")


def test_a_second_manifest_or_a_member_twice_is_refused(board: Path, tmp_path: Path) -> None:
    m = manifest_of(FILES, MODELS)
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items()) + [("nvllm-bundle.json", b"{}")]), board,
            "nvllm-bundle.json", "not listed")
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items()) + [("fold/w.bin", FILES["fold/w.bin"])]),
            board, "fold/w.bin", "twice")


@pytest.mark.parametrize("path", ["../escape.bin", "/etc/passwd", "sub/../../x", "./w.bin", "a//b", ""])
def test_a_manifest_path_out_of_its_model_is_refused(board: Path, tmp_path: Path, path: str) -> None:
    files = {**FILES, f"fold/{path}": b"payload"}
    refused(write_tar(tmp_path / "b.tar", manifest_of(files, MODELS), list(files.items())), board,
            "nvllm-bundle.json", repr(path))
    assert not (board.parent / "escape.bin").exists()


@pytest.mark.parametrize("name", ["../up", "/abs", "a/b", ".hidden", "..", ""])
def test_a_model_name_that_is_not_a_plain_name_is_refused(board: Path, tmp_path: Path, name: str) -> None:
    files = {f"{name}.gguf": b"x"}
    m = manifest_of(files, [(name, "gguf")])
    refused(write_tar(tmp_path / "b.tar", m, list(files.items())), board, "nvllm-bundle.json", "model name")


def test_a_member_whose_name_leads_out_is_refused(board: Path, tmp_path: Path) -> None:
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), [("../a.gguf", FILES["a.gguf"])]), board,
            "../a.gguf", "outside")
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), [("/tmp/a.gguf", FILES["a.gguf"])]), board,
            "/tmp/a.gguf", "outside")


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_link_members_are_refused(board: Path, tmp_path: Path, kind: bytes) -> None:
    # a link listed under a name the manifest holds: its target would be installed in the model's place
    members: list[Member] = [("a.gguf", FILES["a.gguf"]), link("fold/config.json", "/etc/passwd", kind),
                             ("fold/w.bin", b"")]
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), members), board,
            "fold/config.json", "link")


def test_devices_and_fifos_are_refused(board: Path, tmp_path: Path) -> None:
    members: list[Member] = [("a.gguf", FILES["a.gguf"]), link("fold/config.json", "", tarfile.CHRTYPE)]
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), members), board, "fold/config.json", "device")
    members = [("a.gguf", FILES["a.gguf"]), link("fold/config.json", "", tarfile.FIFOTYPE)]
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), members), board, "fold/config.json")


def test_folder_entries_above_listed_files_pass_and_others_do_not(board: Path, tmp_path: Path) -> None:
    d = tarfile.TarInfo("fold")
    d.type = tarfile.DIRTYPE
    ok = write_tar(tmp_path / "ok.tar", manifest_of(FILES, MODELS), [d, *FILES.items()])
    assert {m.action for m in import_bundle(ok, board)} == {"replaced"}
    d = tarfile.TarInfo("other")
    d.type = tarfile.DIRTYPE
    refused(write_tar(tmp_path / "b.tar", manifest_of(FILES, MODELS), [d, *FILES.items()]), board, "other")


def test_sizes_that_disagree_and_missing_members_are_refused(board: Path, tmp_path: Path) -> None:
    m = manifest_of(FILES, MODELS)
    m["models"][1]["files"][1]["size"] += 1
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items())), board, "fold/w.bin", "size")
    m = manifest_of(FILES, MODELS)
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items())[:2]), board, "fold/w.bin", "missing")


def test_what_is_not_a_bundle_is_refused(board: Path, tmp_path: Path) -> None:
    refused(write_tar(tmp_path / "b.tar", None, list(FILES.items())), board, "a.gguf", "first member")
    refused(write_tar(tmp_path / "b.tar", b"not json", list(FILES.items())), board, "nvllm-bundle.json", "JSON")
    m = manifest_of(FILES, MODELS)
    m["format_version"] = 99
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items())), board, "format_version")
    (tmp_path / "junk.tar").write_bytes(b"\x00junk" * 300)
    refused(tmp_path / "junk.tar", board)
    m = manifest_of(FILES, MODELS)
    m["models"].append(m["models"][0])
    refused(write_tar(tmp_path / "b.tar", m, list(FILES.items())), board, "share a name")
