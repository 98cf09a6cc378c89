"""A bundle's signature: Ed25519 over the manifest's exact bytes, kept in a detached file FILE.tar.sig.

Detached, so that signing reads only the manifest (the tar's first member) and never copies the weights,
and so that a bundle already carried to a board can be given its signature later or by another way. The
manifest holds every file's size and sha256, so a signature over it covers every byte the import installs.

The .sig file is one JSON object:

    {"format": "nvllm-bundle-signature", "format_version": 1, "algorithm": "ed25519",
     "key": "SHA256:...",              # the signer's public key fingerprint, as `ssh-keygen -l` prints it
     "manifest_sha256": "...",         # what was signed, to tell a wrong .sig from a tampered bundle
     "signature": "..."}               # base64 of the 64-byte Ed25519 signature of the manifest's bytes

Keys: `nvllm models keygen` writes a PKCS#8 PEM private key (mode 0600) and its public key in PEM beside it
(KEY.pub). A trusted key file may be such a PEM, or OpenSSH lines ("ssh-ed25519 AAAA... comment", one key a
line, as in authorized_keys); an OpenSSH private key made by `ssh-keygen -t ed25519 -N ''` signs as well.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from nvllm.model_files.bundle_manifest import BundleError

SIG_FORMAT = "nvllm-bundle-signature"
SIG_FORMAT_VERSION = 1
SIG_SUFFIX = ".sig"
MAX_SIG_BYTES = 64 << 10


def signature_path(bundle: Path) -> Path:
    """Where the detached signature of bundle lies: FILE.tar.sig beside FILE.tar."""
    return bundle.with_name(bundle.name + SIG_SUFFIX)


def fingerprint(key: Ed25519PublicKey) -> str:
    """The key's OpenSSH fingerprint, SHA256:base64 (what `ssh-keygen -lf KEY.pub` prints)."""
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


# ---------------------------------------------------------------- keys

def generate_key(out: Path) -> tuple[Path, Path, str]:
    """A new Ed25519 key: the private key in out (PKCS#8 PEM, mode 0600, never overwritten), the public one
    in out.pub. Returns both paths and the fingerprint."""
    pub = out.with_name(out.name + ".pub")
    for p in (out, pub):
        if p.exists() or p.is_symlink():
            raise BundleError(f"{p} exists: refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise BundleError(f"cannot write {out}: {e.strerror or e}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(out, 0o600)      # whatever the umask said
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return out, pub, fingerprint(key.public_key())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM (PKCS#8) or OpenSSH private key file, unencrypted."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BundleError(f"cannot read key {path}: {e.strerror or e}") from None
    try:
        key: object
        if b"BEGIN OPENSSH PRIVATE KEY" in data:
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise BundleError(f"key {path} is not an unencrypted PEM or OpenSSH private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"key {path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_keys(path: Path) -> list[Ed25519PublicKey]:
    """The Ed25519 public keys in a file: one PEM, or OpenSSH lines (blank and # lines skipped)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BundleError(f"cannot read trusted key {path}: {e.strerror or e}") from None
    keys: list[object] = []
    try:
        if b"-----BEGIN" in data:
            keys.append(serialization.load_pem_public_key(data))
        else:
            for line in data.splitlines():
                line = line.strip()
                if line and not line.startswith(b"#"):
                    keys.append(serialization.load_ssh_public_key(line))
    except (ValueError, UnsupportedAlgorithm) as e:
        raise BundleError(f"trusted key {path} is not a PEM or OpenSSH public key: {e}") from None
    if not keys:
        raise BundleError(f"trusted key {path} holds no key")
    for k in keys:
        if not isinstance(k, Ed25519PublicKey):
            raise BundleError(f"trusted key {path} holds a {type(k).__name__}, not an Ed25519 key")
    return [k for k in keys if isinstance(k, Ed25519PublicKey)]


# ---------------------------------------------------------------- signatures

@dataclass(frozen=True)
class Signature:
    key: str                # the signer's fingerprint, as written (informative: every trusted key is tried)
    manifest_sha256: str
    signature: bytes


def sign_manifest(manifest: bytes, key: Ed25519PrivateKey) -> bytes:
    """The .sig file's bytes for manifest signed with key."""
    return (json.dumps({
        "format": SIG_FORMAT, "format_version": SIG_FORMAT_VERSION, "algorithm": "ed25519",
        "key": fingerprint(key.public_key()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "signature": base64.b64encode(key.sign(manifest)).decode(),
    }, indent=1) + "\n").encode()


def write_signature(path: Path, data: bytes) -> None:
    """data into path, whole or not at all (a temporary name renamed)."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write {path}: {e.strerror or e}") from None


def read_signature(path: Path) -> Signature:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SIG_BYTES + 1)
    except OSError as e:
        raise BundleError(f"cannot read signature {path}: {e.strerror or e}") from None
    try:
        obj = json.loads(data.decode("utf-8")) if len(data) <= MAX_SIG_BYTES else None
        if not isinstance(obj, dict) or obj.get("format") != SIG_FORMAT or obj.get("algorithm") != "ed25519":
            raise ValueError("not an nvllm Ed25519 bundle signature")
        if obj.get("format_version") != SIG_FORMAT_VERSION:
            raise ValueError(f"format_version {obj.get('format_version')!r} is not {SIG_FORMAT_VERSION}")
        sig = base64.b64decode(str(obj["signature"]), validate=True)
        if len(sig) != 64:
            raise ValueError("the signature is not 64 bytes")
        return Signature(str(obj.get("key", "")), str(obj.get("manifest_sha256", "")), sig)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise BundleError(f"signature {path}: {e}") from None


def verify(manifest: bytes, sig: Signature, keys: list[Ed25519PublicKey], where: str) -> str:
    """The fingerprint of the trusted key that signed manifest; BundleError when none did."""
    for k in keys:
        try:
            k.verify(sig.signature, manifest)
            return fingerprint(k)
        except InvalidSignature:
            continue
    if sig.manifest_sha256 and sig.manifest_sha256 != hashlib.sha256(manifest).hexdigest():
        raise BundleError(f"{where}: signature does not verify: it was made for another manifest "
                          "(the bundle's manifest was changed, or this is another bundle's .sig)")
    raise BundleError(f"{where}: signature does not verify against any trusted key "
                      f"(signed by {sig.key or 'an unnamed key'})")
