"""The matmul library (nvllm.model.kernels._matmul, built from csrc/ with the package) loaded through ctypes:
its ABI number and each exported function's C types. matmul.py holds the loaded library (`matmul.lib`)
and what multiplies through it; step.py and peak.py call it there too.
"""

from __future__ import annotations

import ctypes

from nvllm.model.kernels.library import load_library

ABI = 20  # must equal matmul_abi() in csrc/matmul.c

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


def open_matmul_library() -> tuple[ctypes.CDLL | None, str]:
    """The matmul library with each function's C types declared, or None and why not (library.py)."""
    lib, why_not = load_library("_matmul", "matmul_abi", ABI, "C matmul kernels")
    if lib is not None:
        lib.quant_matmul.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _P, _I64, _I64, _P, _I64, ctypes.c_int]
        lib.quant_matmul.restype = ctypes.c_int
        lib.quant_dequantize.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P, ctypes.c_int]
        lib.quant_dequantize.restype = ctypes.c_int
        lib.matmul_team_run.argtypes = [_P, _P, ctypes.c_int]
        lib.matmul_team_run.restype = ctypes.c_int
        lib.matmul_team_threads.argtypes = []
        lib.matmul_team_threads.restype = ctypes.c_int
        lib.matmul_pin_threads.argtypes = [ctypes.c_int]
        lib.matmul_pin_threads.restype = ctypes.c_int
        lib.matmul_team_stats.argtypes = [ctypes.c_int, _P]
        lib.matmul_team_stats.restype = None
        lib.matmul_float_variants.argtypes = []
        lib.matmul_float_variants.restype = ctypes.c_int
        lib.matmul_float_variant.argtypes = [ctypes.c_int]
        lib.matmul_float_variant.restype = ctypes.c_int
        lib.dot_peak.argtypes = [ctypes.c_int, _I64]
        lib.dot_peak.restype = _I64
        lib.pack_bytes.argtypes = [ctypes.c_int, _I64, _I64]   # csrc/pack.c
        lib.pack_bytes.restype = _I64
        lib.pack_panels.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P]
        lib.pack_panels.restype = None
        lib.unpack_rows.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _P]
        lib.unpack_rows.restype = None
        lib.dot_variants.argtypes = []   # csrc/dot.c
        lib.dot_variants.restype = ctypes.c_int
        lib.dot_variant.argtypes = [ctypes.c_int]
        lib.dot_variant.restype = ctypes.c_int
        lib.dot_variant_name.argtypes = [ctypes.c_int]
        lib.dot_variant_name.restype = ctypes.c_char_p
        lib.dot_x_bytes.argtypes = [ctypes.c_int, _I64, _I64]
        lib.dot_x_bytes.restype = ctypes.c_size_t
        lib.dot_quantize_x.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P]
        lib.dot_quantize_x.restype = None
        lib.decode_layers.argtypes = [_P]   # csrc/step.c, wrapped by step.py
        lib.decode_layers.restype = ctypes.c_int
    return lib, why_not
