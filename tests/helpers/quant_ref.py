"""Scalar transcriptions of llama.cpp's reference quantizers (ggml-quants.c), float32 operation by float32
operation, that tests/model/quant/test_quantize.py and test_quantize_k.py hold nvllm's vectorised quantizers to."""
from __future__ import annotations

import numpy as np

F = np.float32


def ref_nearest_int(v: np.float32) -> int:
    val = np.array([F(v) + F(12582912.0)], F)
    i = int(val.view(np.int32)[0])
    return (i & 0x007FFFFF) - 0x00400000


# make_qkx2_quants' rmin and rdelta as quantize_row_q4_K_ref passes them (-1.f, 0.1f)
QKX2_RMIN = F(-1.0)
QKX2_RDELTA = F(0.1)


def ref_make_qkx2_quants(x, w, nmax=15, rmin=QKX2_RMIN, rdelta=QKX2_RDELTA, nstep=20, use_mad=False):
    """make_qkx2_quants(n = len(x)), a line of C for a line of Python."""
    n = len(x)
    lo, hi = x[0], x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < lo:
            lo = x[i]
        if x[i] > hi:
            hi = x[i]
        sum_w = F(sum_w + w[i])
        sum_x = F(sum_x + w[i] * x[i])
    if lo > 0:
        lo = F(0)
    if hi == lo:
        return [0] * n, F(0), F(-lo)
    iscale = F(nmax) / F(hi - lo)
    scale = F(1) / iscale
    L = [0] * n
    best = F(0)
    for i in range(n):
        L[i] = max(0, min(nmax, ref_nearest_int(F(iscale * F(x[i] - lo)))))
        diff = F(F(scale * F(L[i])) + lo) - x[i]
        best = F(best + w[i] * (abs(diff) if use_mad else F(diff * diff)))
    for step in range(nstep + 1):
        iscale = F(F(rmin + F(rdelta * F(step))) + F(nmax)) / F(hi - lo)
        sum_l = sum_l2 = sum_xl = F(0)
        aux = [0] * n
        for i in range(n):
            li = max(0, min(nmax, ref_nearest_int(F(iscale * F(x[i] - lo)))))
            aux[i] = li
            sum_l = F(sum_l + w[i] * F(li))
            sum_l2 = F(sum_l2 + F(w[i] * F(li)) * F(li))
            sum_xl = F(sum_xl + F(w[i] * F(li)) * x[i])
        det = F(sum_w * sum_l2) - F(sum_l * sum_l)
        if det > 0:
            this_scale = F(F(sum_w * sum_xl) - F(sum_x * sum_l)) / det
            this_min = F(F(sum_l2 * sum_x) - F(sum_l * sum_xl)) / det
            if this_min > 0:
                this_min = F(0)
                this_scale = F(sum_xl / sum_l2)
            err = F(0)
            for i in range(n):
                diff = F(F(this_scale * F(aux[i])) + this_min) - x[i]
                err = F(err + w[i] * (abs(diff) if use_mad else F(diff * diff)))
            if err < best:
                L, best, scale, lo = aux, err, this_scale, this_min
    return L, scale, F(-lo)




def _crumb_bytes(L: list[int]) -> bytes:
    """2-bit quants of a super-block -> qs[64] (Q2_K's and Q3_K's layout)."""
    return bytes(L[j + k] | (L[j + k + 32] << 2) | (L[j + k + 64] << 4) | (L[j + k + 96] << 6)
                 for j in (0, 128) for k in range(32))


def ref_quantize_row_q2_k(x: np.ndarray) -> bytes:
    """quantize_row_q2_K_ref over one row."""
    out = bytearray()
    for b in range(len(x) // 256):
        xb = x[256 * b:256 * (b + 1)]
        L = [0] * 256
        scales, mins = [F(0)] * 16, [F(0)] * 16
        max_scale = max_min = F(0)
        for j in range(16):
            sub = xb[16 * j:16 * (j + 1)]
            w = [F(abs(v)) for v in sub]
            Lj, scales[j], mins[j] = ref_make_qkx2_quants(sub, w, 3, F(-0.5), F(0.1), 15, use_mad=True)
            L[16 * j:16 * (j + 1)] = Lj
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        sc = [0] * 16
        if max_scale > 0:
            iscale = F(F(15) / max_scale)
            sc = [ref_nearest_int(F(iscale * s)) & 0xFF for s in scales]
            d16 = np.float16(F(max_scale / F(15)))
        else:
            d16 = np.float16(0)
        if max_min > 0:
            iscale = F(F(15) / max_min)
            sc = [(sc[j] | (ref_nearest_int(F(iscale * mins[j])) << 4)) & 0xFF for j in range(16)]
            dmin16 = np.float16(F(max_min / F(15)))
        else:
            dmin16 = np.float16(0)
        for j in range(16):
            d = F(F(d16) * F(sc[j] & 0xF))
            if not d:
                continue
            dm = F(F(dmin16) * F(sc[j] >> 4))
            for i in range(16):
                L[16 * j + i] = max(0, min(3, ref_nearest_int(F(F(xb[16 * j + i] + dm) / d))))
        out += bytes(sc) + _crumb_bytes(L) + np.array([d16, dmin16], "<f2").tobytes()
    return bytes(out)


def ref_make_q3_quants(x) -> tuple[list[int], np.float32]:
    """make_q3_quants(n 16, nmax 4, do_rmse true): quants in 0..7 (less 4: the value's) and the scale."""
    n, nmax = len(x), 4
    big = amax = F(0)
    for v in x:
        if abs(v) > amax:
            amax, big = F(abs(v)), v
    if amax < F(1e-15):
        return [0] * n, F(0)
    iscale = F(F(-nmax) / big)
    L = [0] * n
    sumlx = suml2 = F(0)
    for i in range(n):
        li = max(-nmax, min(nmax - 1, ref_nearest_int(F(iscale * x[i]))))
        L[i] = li
        w = F(x[i] * x[i])
        sumlx = F(sumlx + F(F(w * x[i]) * F(li)))
        suml2 = F(suml2 + F(F(w * F(li)) * F(li)))
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = F(x[i] * x[i])
            slx = F(sumlx - F(F(w * x[i]) * F(L[i])))
            if slx > 0:
                sl2 = F(suml2 - F(F(w * F(L[i])) * F(L[i])))
                new = max(-nmax, min(nmax - 1, ref_nearest_int(F(F(x[i] * sl2) / slx))))
                if new != L[i]:
                    slx = F(slx + F(F(w * x[i]) * F(new)))
                    sl2 = F(sl2 + F(F(w * F(new)) * F(new)))
                    if sl2 > 0 and F(F(slx * slx) * suml2) > F(F(sumlx * sumlx) * sl2):
                        L[i], sumlx, suml2 = new, slx, sl2
                        changed += 1
        if not changed:
            break
    return [li + nmax for li in L], (F(sumlx / suml2) if suml2 > 0 else F(0))


def ref_quantize_row_q3_k(x: np.ndarray) -> bytes:
    """quantize_row_q3_K_ref over one row."""
    out = bytearray()
    for b in range(len(x) // 256):
        xb = x[256 * b:256 * (b + 1)]
        L = [0] * 256
        scales = [F(0)] * 16
        max_scale = amax = F(0)
        for j in range(16):
            L[16 * j:16 * (j + 1)], scales[j] = ref_make_q3_quants(xb[16 * j:16 * (j + 1)])
            if abs(scales[j]) > amax:
                amax, max_scale = F(abs(scales[j])), scales[j]
        sc = [0] * 12
        if max_scale:
            iscale = F(F(-32) / max_scale)
            for j in range(16):
                lv = max(-32, min(31, ref_nearest_int(F(iscale * scales[j])))) + 32
                if j < 8:
                    sc[j] = lv & 0xF
                else:
                    sc[j - 8] |= (lv & 0xF) << 4
                sc[j % 4 + 8] |= (lv >> 4) << (2 * (j // 4))
            d16 = np.float16(F(F(1) / iscale))
        else:
            d16 = np.float16(0)
        for j in range(16):
            s = (sc[j] & 0xF) if j < 8 else (sc[j - 8] >> 4)
            s = (s | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
            d = F(F(d16) * F(s))
            if not d:
                continue
            for i in range(16):
                L[16 * j + i] = max(-4, min(3, ref_nearest_int(F(xb[16 * j + i] / d)))) + 4
        hmask = [0] * 32
        for j in range(256):
            if L[j] > 3:
                hmask[j % 32] |= 1 << (j // 32)
                L[j] -= 4
        out += bytes(hmask) + _crumb_bytes(L) + bytes(sc) + np.array([d16], "<f2").tobytes()
    return bytes(out)


def _ref_k_super_block(xb: np.ndarray, nmax: int, *fit) -> tuple[np.float16, np.float16, list[int], list[int]]:
    """What quantize_row_q4_K_ref and quantize_row_q5_K_ref share for one 256-value super-block: each
    sub-block of 32 fitted (make_qkx2_quants with `fit`), the 6-bit scales and mins packed into 12 bytes,
    and the quants in [0, nmax] recomputed from the rounded scales. Returns d, dmin, the scale bytes, L."""
    L = [0] * 256
    scales, mins = [F(0)] * 8, [F(0)] * 8
    max_scale = max_min = F(0)
    for j in range(8):
        sub = xb[32 * j:32 * (j + 1)]
        sum_x2 = F(0)
        for v in sub:
            sum_x2 = F(sum_x2 + v * v)
        av_x = F(np.sqrt(F(sum_x2 / F(32))))
        w = [F(av_x + abs(v)) for v in sub]
        L[32 * j:32 * (j + 1)], scales[j], mins[j] = ref_make_qkx2_quants(sub, w, nmax, *fit)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = F(63) / max_scale if max_scale > 0 else F(0)
    inv_min = F(63) / max_min if max_min > 0 else F(0)
    sc = [0] * 12
    ls_all, lm_all = [], []
    for j in range(8):
        ls = min(63, ref_nearest_int(F(inv_scale * scales[j])) & 0xFF)
        lm = min(63, ref_nearest_int(F(inv_min * mins[j])) & 0xFF)
        ls_all.append(ls)
        lm_all.append(lm)
        if j < 4:
            sc[j], sc[j + 4] = ls, lm
        else:
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[j - 4] |= (ls >> 4) << 6
            sc[j] |= (lm >> 4) << 6
    d16 = np.float16(F(max_scale / F(63)))
    dmin16 = np.float16(F(max_min / F(63)))
    for j in range(8):
        d = F(F(d16) * F(ls_all[j]))
        if not d:
            continue
        dm = F(F(dmin16) * F(lm_all[j]))
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, ref_nearest_int(F(F(xb[32 * j + i] + dm) / d))))
    return d16, dmin16, sc, L


def ref_quantize_row_q4_k(x: np.ndarray) -> bytes:
    """quantize_row_q4_K_ref over one row (a whole number of 256-value super-blocks)."""
    out = bytearray()
    for b in range(len(x) // 256):
        d16, dmin16, sc, L = _ref_k_super_block(x[256 * b:256 * (b + 1)], 15)
        qs = [L[c * 64 + k] | (L[c * 64 + 32 + k] << 4) for c in range(4) for k in range(32)]
        out += np.array([d16, dmin16], "<f2").tobytes() + bytes(sc) + bytes(qs)
    return bytes(out)


def ref_quantize_row_q5_k(x: np.ndarray) -> bytes:
    """quantize_row_q5_K_ref over one row."""
    out = bytearray()
    for b in range(len(x) // 256):
        d16, dmin16, sc, L = _ref_k_super_block(x[256 * b:256 * (b + 1)], 31, F(-0.5), F(0.1), 15)
        qh, ql = [0] * 32, [0] * 128
        for p in range(4):
            for j in range(32):
                l1, l2 = L[64 * p + j], L[64 * p + 32 + j]
                if l1 > 15:
                    l1 -= 16
                    qh[j] |= 1 << (2 * p)
                if l2 > 15:
                    l2 -= 16
                    qh[j] |= 2 << (2 * p)
                ql[32 * p + j] = l1 | (l2 << 4)
        out += np.array([d16, dmin16], "<f2").tobytes() + bytes(sc) + bytes(qh) + bytes(ql)
    return bytes(out)


KVALUES_IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def ref_best_index_int8(x: np.float32) -> int:
    """best_index_int8(16, kvalues_iq4nl, x): a binary search, as the C does it."""
    val = KVALUES_IQ4NL
    if x <= val[0]:
        return 0
    if x >= val[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < val[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if F(x - F(val[mu - 1])) < F(F(val[mu]) - x) else mu


def ref_quantize_iq4(x: np.ndarray, super_block: int) -> bytes:
    """quantize_row_iq4_nl_impl(super_block, 32, ..., no weights, ntry 7) over one super-block or block, as
    quantize_iq4_nl (super_block 32) and quantize_iq4_xs (256) call it."""
    ntry, v0 = 7, KVALUES_IQ4NL[0]
    nb = super_block // 32
    L = [0] * super_block
    scales = [F(0)] * nb
    max_scale = amax_scale = F(0)
    for ib in range(nb):
        xb = x[32 * ib:32 * (ib + 1)]
        w = [F(v * v) for v in xb]
        amax = big = F(0)
        for v in xb:
            if abs(v) > amax:
                amax, big = F(abs(v)), v
        if amax < F(1e-15):
            scales[ib] = F(0)
            continue
        d = F(F(-big) / F(v0))
        iscale = F(F(1) / d)
        sumqx = sumq2 = F(0)
        for j in range(32):
            li = ref_best_index_int8(F(iscale * xb[j]))
            L[32 * ib + j] = li
            q = F(KVALUES_IQ4NL[li])
            sumqx = F(sumqx + F(F(w[j] * q) * xb[j]))
            sumq2 = F(sumq2 + F(F(w[j] * q) * q))
        d = F(sumqx / sumq2) if sumq2 > 0 else F(0)
        best = F(d * sumqx)
        for itry in range(-ntry, ntry + 1):
            iscale = F(F(itry + v0) / big)
            sumqx = sumq2 = F(0)
            for j in range(32):
                q = F(KVALUES_IQ4NL[ref_best_index_int8(F(iscale * xb[j]))])
                sumqx = F(sumqx + F(F(w[j] * q) * xb[j]))
                sumq2 = F(sumq2 + F(F(w[j] * q) * q))
            if sumq2 > 0 and F(sumqx * sumqx) > F(best * sumq2):
                d = F(sumqx / sumq2)
                best = F(d * sumqx)
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale, max_scale = F(abs(d)), d
    head = b""
    if nb > 1:
        d = F(F(-max_scale) / F(32))
        iscale = F(F(1) / d) if d else F(0)
        scales_h, scales_l = 0, [0] * 4
        for ib in range(nb):
            lv = max(-32, min(31, ref_nearest_int(F(iscale * scales[ib]))))
            dl = F(d * F(lv))
            idl = F(F(1) / dl) if dl else F(0)
            for j in range(32):
                L[32 * ib + j] = ref_best_index_int8(F(idl * x[32 * ib + j]))
            lv += 32
            scales_l[ib // 2] |= (lv & 0xF) << (4 * (ib % 2))
            scales_h |= (lv >> 4) << (2 * ib)
        head = np.array([d], "<f2").tobytes() + np.array([scales_h], "<u2").tobytes() + bytes(scales_l)
    else:
        head = np.array([scales[0]], "<f2").tobytes()
        iscale = F(F(1) / scales[0]) if scales[0] else F(0)
        L = [ref_best_index_int8(F(iscale * v)) for v in x[:32]]
    qs = bytes(L[32 * i + j] | (L[32 * i + 16 + j] << 4) for i in range(nb) for j in range(16))
    return head + qs


def ref_quantize_row_iq4_nl(x: np.ndarray) -> bytes:
    return b"".join(ref_quantize_iq4(x[32 * b:32 * (b + 1)], 32) for b in range(len(x) // 32))


def ref_quantize_row_iq4_xs(x: np.ndarray) -> bytes:
    return b"".join(ref_quantize_iq4(x[256 * b:256 * (b + 1)], 256) for b in range(len(x) // 256))
