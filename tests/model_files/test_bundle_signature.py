"""Signed bundles: a signature over the manifest by a trusted key is accepted (keys as PEM or OpenSSH lines);
one by another key, one made for another manifest, a garbled one, and an unsigned bundle where signatures
are required are refused before any file is staged, the board left as it was."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from helpers.bundles import make_models, state
from nvllm.config import ConfigError, load_settings
from nvllm.model_files import bundle_import
from nvllm.model_files.bundle_export import export_bundle
from nvllm.model_files.bundle_import import Trust, import_bundle, manifest_bytes
from nvllm.model_files.bundle_manifest import BundleError
from nvllm.model_files.bundle_signature import (
    fingerprint,
    generate_key,
    load_private_key,
    load_public_keys,
    sign_manifest,
    signature_path,
    write_signature,
)


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    generate_key(tmp_path / "ours")
    generate_key(tmp_path / "theirs")
    return {"ours": tmp_path / "ours", "theirs": tmp_path / "theirs"}


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    out = tmp_path / "b.tar"
    export_bundle(["a", "fold"], out, make_models(tmp_path / "src"))
    return out


@pytest.fixture()
def board(tmp_path: Path) -> Path:
    return make_models(tmp_path / "board", seed=1)


def sign(bundle: Path, key: Path) -> Path:
    write_signature(signature_path(bundle), sign_manifest(manifest_bytes(bundle), load_private_key(key)))
    return signature_path(bundle)


def trust(*pubs: Path, required: bool = True) -> Trust:
    return Trust(tuple(k for p in pubs for k in load_public_keys(p)), required)


def refused_before_staging(bundle: Path, board: Path, t: Trust, monkeypatch: pytest.MonkeyPatch,
                           *words: str) -> None:
    def no_staging(*a: object) -> None:
        raise AssertionError("a file was staged")

    monkeypatch.setattr(bundle_import, "_stage", no_staging)
    before = state(board)
    with pytest.raises(BundleError) as e:
        import_bundle(bundle, board, t)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert state(board) == before


def test_keygen_writes_a_private_key_only_its_owner_reads(keys: dict[str, Path]) -> None:
    key = keys["ours"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert key.with_name("ours.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(BundleError, match="exists"):
        generate_key(key)


def test_a_good_signature_is_accepted(bundle: Path, board: Path, keys: dict[str, Path]) -> None:
    sign(bundle, keys["ours"])
    pubs = (keys["theirs"].with_name("theirs.pub"), keys["ours"].with_name("ours.pub"))
    assert [m.action for m in import_bundle(bundle, board, trust(*pubs))] == ["replaced", "replaced"]


def test_openssh_public_key_lines_are_trusted_keys(bundle: Path, board: Path, keys: dict[str, Path],
                                                  tmp_path: Path) -> None:
    sign(bundle, keys["ours"])
    lines = tmp_path / "authorized"
    lines.write_bytes(b"# the fleet's keys\n\n" + b"\n".join(
        load_private_key(keys[k]).public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                            serialization.PublicFormat.OpenSSH) + b" " + k.encode()
        for k in ("theirs", "ours")) + b"\n")
    assert len(load_public_keys(lines)) == 2
    assert import_bundle(bundle, board, trust(lines))


def test_an_openssh_private_key_signs(bundle: Path, board: Path, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    k = Ed25519PrivateKey.generate()
    (tmp_path / "id_ed25519").write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.OpenSSH,
                                                          serialization.NoEncryption()))
    sign(bundle, tmp_path / "id_ed25519")
    pub = tmp_path / "id.pub"
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    assert import_bundle(bundle, board, trust(pub))
    assert json.loads(signature_path(bundle).read_text())["key"] == fingerprint(k.public_key())


def test_a_signature_by_another_key_is_refused(bundle: Path, board: Path, keys: dict[str, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sign(bundle, keys["theirs"])
    refused_before_staging(bundle, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch,
                           "does not verify against any trusted key", fingerprint(
                               load_private_key(keys["theirs"]).public_key()))
    # not required, but keys given: a signature present must still verify
    refused_before_staging(bundle, board, trust(keys["ours"].with_name("ours.pub"), required=False), monkeypatch,
                           "does not verify")


def test_a_tampered_manifest_is_refused(bundle: Path, board: Path, keys: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sig = sign(bundle, keys["ours"])
    # the same bundle made again from other files: a new manifest, with the first bundle's signature
    other = tmp_path / "other.tar"
    export_bundle(["a", "fold"], other, make_models(tmp_path / "src2", seed=7))
    signature_path(other).write_bytes(sig.read_bytes())
    refused_before_staging(other, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch,
                           "made for another manifest")
    # one byte of the manifest changed in place (a size digit), the tar otherwise as signed
    data = bytearray(bundle.read_bytes())
    with tarfile.open(bundle) as tar:
        first = tar.getmembers()[0]
    i = data.index(b'"size": ', first.offset_data) + len(b'"size": ')
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    signature_path(bad).write_bytes(sig.read_bytes())
    refused_before_staging(bad, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch, "does not verify")


def test_an_unsigned_bundle_is_refused_where_signatures_are_required(bundle: Path, board: Path,
                                                                     keys: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    refused_before_staging(bundle, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch,
                           "unsigned", "required")
    refused_before_staging(bundle, board, Trust((), True), monkeypatch, "no trusted key")


def test_a_garbled_signature_is_refused(bundle: Path, board: Path, keys: dict[str, Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sig = sign(bundle, keys["ours"])
    obj = json.loads(sig.read_text())
    obj["signature"] = obj["signature"][:-8] + "AAAAAA=="
    sig.write_text(json.dumps(obj))
    refused_before_staging(bundle, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch, "does not verify")
    sig.write_text("not json")
    refused_before_staging(bundle, board, trust(keys["ours"].with_name("ours.pub")), monkeypatch, "signature")
    os.remove(sig)
    with pytest.raises(BundleError, match="does not exist"):
        import_bundle(bundle, board, Trust(), signature=sig)


def test_wrong_key_files_are_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    p = tmp_path / "ec.pem"
    p.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(BundleError, match="not an Ed25519 key"):
        load_public_keys(p)
    (tmp_path / "empty.pub").write_text("# nothing\n")
    with pytest.raises(BundleError, match="holds no key"):
        load_public_keys(tmp_path / "empty.pub")
    with pytest.raises(BundleError, match="cannot read"):
        load_private_key(tmp_path / "missing")


def test_bundles_settings(tmp_path: Path) -> None:
    toml = tmp_path / "nvllm.toml"
    toml.write_text('[bundles]\ntrusted_keys = ["/etc/nvllm/fleet.pub"]\nrequire_signature = true\n')
    s = load_settings(toml)
    assert s.bundles.trusted_keys == ["/etc/nvllm/fleet.pub"] and s.bundles.require_signature
    toml.write_text("[bundles]\nrequire_signature = true\n")
    with pytest.raises(ConfigError, match="needs bundles.trusted_keys"):
        load_settings(toml)
