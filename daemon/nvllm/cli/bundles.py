"""nvllm models export | import | keygen | sign: models carried to offline boards in one tar, checked file by
file before anything is installed, and signed with Ed25519 (model_files/bundle_*.py; docs/models.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

BUNDLE_ACTIONS = ("export", "import", "keygen", "sign")


def add_bundle_parsers(msub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    me = msub.add_parser("export", help="write models of DIR into one bundle (a tar, its manifest first)",
                         description="A tar whose first member, nvllm-bundle.json, lists each model's files "
                                     "with their sizes and sha256; then the files. Written to a temporary "
                                     "name and renamed when whole; '-' streams it to stdout.")
    me.add_argument("names", nargs="+", metavar="NAME",
                    help="a model in DIR (NAME.gguf or the folder NAME; NAME.gguf or NAME/ when both), or a path")
    me.add_argument("--out", required=True, help="the bundle to write (FILE.tar, or - for stdout)")
    me.add_argument("--dir", default="models")
    me.add_argument("--key", help="also sign it with this private key (writes FILE.tar.sig)")
    me.add_argument("--quiet", action="store_true")
    mi = msub.add_parser("import", help="check a bundle file by file, then install its models into DIR",
                         description="Every member is checked against the manifest (name, size, sha256; links, "
                                     "paths outside the model and unlisted members refused) while it streams "
                                     "into a staging folder; the models are installed only when all are good. "
                                     "FILE.tar.sig beside the bundle is its signature.")
    mi.add_argument("bundle", help="the bundle (FILE.tar, or - for stdin)")
    mi.add_argument("--dir", default=None, help="the models folder (default: the config's model.models_dir, "
                                                "else models)")
    mi.add_argument("--config", help="TOML settings file: its [bundles] trusted_keys and require_signature apply")
    mi.add_argument("--trusted-key", action="append", default=[], metavar="FILE",
                    help="a trusted public key file (PEM or OpenSSH lines); repeatable, added to the config's")
    mi.add_argument("--require-signature", action="store_true", help="refuse an unsigned bundle")
    mi.add_argument("--signature", help="the bundle's signature file (default FILE.tar.sig; needed with -)")
    mi.add_argument("--quiet", action="store_true")
    mk = msub.add_parser("keygen", help="write a new Ed25519 signing key KEY (mode 0600) and KEY.pub")
    mk.add_argument("--out", required=True, metavar="KEY")
    mg = msub.add_parser("sign", help="sign a bundle's manifest: writes FILE.tar.sig")
    mg.add_argument("bundle")
    mg.add_argument("--key", required=True, help="the private key (PEM, or an unencrypted OpenSSH key)")
    mg.add_argument("--out", help="the signature file (default FILE.tar.sig)")


def _say(quiet: bool) -> Callable[[str], None]:
    def progress(msg: str) -> None:
        if not quiet:
            print(f"nvllm models: {msg}", file=sys.stderr, flush=True)
    return progress


def cmd_bundles(args: argparse.Namespace) -> int:
    from nvllm.model_files.bundle_import import InstallError
    from nvllm.model_files.bundle_manifest import BundleError

    try:
        return _run(args)
    except InstallError as e:
        print(f"nvllm models import: {e}", file=sys.stderr)
        return 1
    except BundleError as e:
        after = "; nothing installed" if args.action == "import" else ""
        print(f"nvllm models {args.action}: {e}{after}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from nvllm.model_files import bundle_signature as sig
    from nvllm.model_files.bundle_import import manifest_bytes

    if args.action == "keygen":
        key, pub, fp = sig.generate_key(Path(args.out))
        print(f"{key}\n{pub}\n{fp}")
        return 0
    if args.action == "sign":
        bundle = Path(args.bundle)
        out = Path(args.out) if args.out else sig.signature_path(bundle)
        private = sig.load_private_key(Path(args.key))
        sig.write_signature(out, sig.sign_manifest(manifest_bytes(bundle), private))
        print(out)
        return 0
    if args.action == "export":
        return _export(args)
    return _import(args)


def _export(args: argparse.Namespace) -> int:
    from nvllm.model_files import bundle_signature as sig
    from nvllm.model_files.bundle_export import export_bundle

    key = sig.load_private_key(Path(args.key)) if args.key else None
    if key is not None and args.out == "-":
        print("nvllm models export: --key needs --out FILE (the signature goes beside it)", file=sys.stderr)
        return 2
    data = export_bundle(args.names, args.out, args.dir, _say(args.quiet))
    if key is not None:
        sig_file = sig.signature_path(Path(args.out))
        sig.write_signature(sig_file, sig.sign_manifest(data, key))
    if args.out != "-":
        print(args.out)
    return 0


def _import(args: argparse.Namespace) -> int:
    from nvllm.config import ConfigError, load_settings
    from nvllm.model_files import bundle_signature as sig
    from nvllm.model_files.bundle_import import Trust, import_bundle

    try:
        settings = load_settings(args.config) if args.config else None
    except ConfigError as e:
        print(f"nvllm models import: {e}", file=sys.stderr)
        return 2
    key_files = (settings.bundles.trusted_keys if settings else []) + args.trusted_key
    keys = tuple(k for f in key_files for k in sig.load_public_keys(Path(f)))
    required = args.require_signature or bool(settings and settings.bundles.require_signature)
    models_dir = args.dir or (settings.model.models_dir if settings else "models")
    done = import_bundle(args.bundle, models_dir, Trust(keys, required), args.signature, _say(args.quiet))
    for m in done:
        print(f"{m.action}  {m.name}  {m.path}")
    return 0
