"""Run a Python script under the seccomp rules deploy/nvllm.service asks systemd for.

    python tests/helpers/unit_sandbox.py SCRIPT [ARGS...]
    python tests/helpers/unit_sandbox.py -m MODULE [ARGS...]      e.g. -m nvllm.cli serve --config ...

Reads SystemCallFilter=, SystemCallErrorNumber= and MemoryDenyWriteExecute= from the unit, expands the
syscall groups with `systemd-analyze syscall-filter`, loads the same filter through libseccomp (ctypes)
and then runs SCRIPT in this process. A test runs the daemon's libraries (NumPy/OpenBLAS, grpcio,
tokenizers, safetensors, psutil) under it, so a dependency that starts to need W+X memory or a filtered
system call fails here instead of on a board. systemd 252 puts MemoryDenyWriteExecute= into seccomp the
same way: no mmap() both writable and executable, no mprotect()/pkey_mprotect() adding PROT_EXEC, no
shmat() with SHM_EXEC.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import runpy
import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "nvllm.service"

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_CMP_MASKED_EQ = 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache
def expand(group: str) -> frozenset[str]:
    """@group -> the system call names in it, nested groups included."""
    if not group.startswith("@"):
        return frozenset([group])
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], check=True,
                         capture_output=True, text=True).stdout
    names: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            names |= expand(item)
    return frozenset(names)


def unit_rules(unit: Path = UNIT) -> tuple[set[str], int, bool]:
    """(allowed syscalls, action for the rest, memory-deny-write-execute) as the unit sets them."""
    allowed: set[str] | None = None
    action = SCMP_ACT_KILL_PROCESS
    mdwe = False
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "SystemCallFilter":
            deny = value.startswith("~")
            names = set().union(*(expand(item) for item in value.lstrip("~").split()))
            if allowed is None:
                if deny:
                    raise SystemExit("unit_sandbox handles allow lists only (first SystemCallFilter= without ~)")
                allowed = set(expand("@default"))  # systemd adds @default to every allow list
            allowed = allowed - names if deny else allowed | names
        elif key == "SystemCallErrorNumber":
            action = 0x00050000 | getattr(errno, value)
        elif key == "MemoryDenyWriteExecute":
            mdwe = value == "yes"
    if allowed is None:
        raise SystemExit(f"{unit} sets no SystemCallFilter=")
    return allowed, action, mdwe


def load_filter(allowed: set[str], action: int, mdwe: bool) -> int:
    """Install the filter on this (still single-threaded) process; returns the number of rules."""
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(action)
    guarded = {"mmap": [PROT_WRITE, PROT_EXEC], "mprotect": [PROT_EXEC], "pkey_mprotect": [PROT_EXEC],
               "shmat": [SHM_EXEC]} if mdwe else {}
    count = 0
    for name in sorted(allowed):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:  # not a system call on this architecture
            continue
        # Allowed only while one of the guarded bits is clear: rules for one call are OR-ed.
        for bit in guarded.get(name, [None]):
            if bit is None:
                rc = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None)
            else:
                arg = 2  # prot for mmap/mprotect/pkey_mprotect, shmflg for shmat
                cmp = (_ArgCmp * 1)(_ArgCmp(arg, SCMP_CMP_MASKED_EQ, bit, 0))
                rc = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, cmp)
            if rc != 0:
                raise OSError(-rc, f"seccomp_rule_add({name})")
            count += 1
    rc = lib.seccomp_load(ctx)  # also sets no_new_privs, as NoNewPrivileges=yes does
    if rc != 0:
        raise OSError(-rc, "seccomp_load")
    return count


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    allowed, action, mdwe = unit_rules()
    count = load_filter(allowed, action, mdwe)
    print(f"unit_sandbox: {count} rules, MemoryDenyWriteExecute={'yes' if mdwe else 'no'}", flush=True)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
