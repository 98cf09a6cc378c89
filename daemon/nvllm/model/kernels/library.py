"""Finds and loads the C extensions built with the package (csrc/, beside this file), and says why not.

NVLLM_KERNELS=0 in the environment turns them all off (to compare, or to rule them out); the NumPy twins
run instead.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path


def load_library(stem: str, abi_function: str, abi: int, what: str) -> tuple[ctypes.CDLL | None, str]:
    """The extension nvllm.model.kernels.<stem> built with the package, or None and why not: turned off by
    NVLLM_KERNELS=0, not built, or built from another version (its ABI number differs)."""
    if os.environ.get("NVLLM_KERNELS", "1") == "0":
        return None, "C kernels turned off by NVLLM_KERNELS=0"
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{stem}{suffix}"
        if path.exists():
            found = ctypes.CDLL(str(path))
            got = getattr(found, abi_function)() if hasattr(found, abi_function) else 0
            if got != abi:
                return None, (f"{what} in {path.name} are from another version (ABI {got}, need {abi}): "
                              f"reinstall nvllm (pip install -e .) to rebuild them")
            return found, ""
    return None, f"{what} not built: no C compiler when nvllm was installed; slower"
