#!/usr/bin/env python3
"""tools/fp8_golden.py — the FP8 conversion goldens of tests/base:test_fp8.

Needs numpy and ml_dtypes (a venv outside the repo:
`python3 -m venv /tmp/fp8venv && /tmp/fp8venv/bin/pip install ml_dtypes numpy`);
run once, `/tmp/fp8venv/bin/python tools/fp8_golden.py [OUTDIR]` (default
tests/base/data); the test suite only reads what it wrote:

  bf16_to_e4m3.bin  65536 bytes: byte i is the E4M3 (ml_dtypes.float8_e4m3fn)
                    of the bf16 whose bit pattern is i
  bf16_to_e5m2.bin  65536 bytes: the same for E5M2 (ml_dtypes.float8_e5m2)
  e4m3_to_f32.bin   256 little-endian fp32 bit patterns: byte i's value
  e5m2_to_f32.bin   the same for E5M2

The saturation rule. loom narrows as CUDA's __nv_cvt_float_to_fp8(x,
__NV_SATFINITE, ...) and Transformer Engine do: round to nearest even, and a
magnitude that would round past the largest finite value (448 for E4M3, 57344
for E5M2), infinity included, becomes that value with its sign; NaN stays NaN.
ml_dtypes' astype does not saturate (E4M3 overflows to NaN, E5M2 to inf), so
each input is first clipped in float32 to [-max, max] (np.clip leaves NaN
NaN) and then converted. That is the same as rounding first and saturating
after: everything from max up to the tie with the next step (464, 61440)
rounds down to max anyway, and everything beyond overflows and saturates to
max. The script checks that equivalence against ml_dtypes' raw (unclipped)
result for every input, and holds both to an independent nearest-even
reference computed here from the formats' definitions, so that a conversion
that rounded twice (through fp16, say) would be caught.

Each bf16 is converted from its float32 value (a widening shift, exact), so
the conversion rounds once from the bf16's own value.
"""
import os
import sys

import ml_dtypes
import numpy as np

# name, ml_dtypes type, exponent bits, mantissa bits, bias, largest finite
# byte, has infinities
FORMATS = [
    ("e4m3", ml_dtypes.float8_e4m3fn, 4, 3, 7, 0x7E, False),
    ("e5m2", ml_dtypes.float8_e5m2, 5, 2, 15, 0x7B, True),
]


def value(code, ebits, mbits, bias):
    """The value of a positive finite code, from the format's definition."""
    e, m = code >> mbits, code & ((1 << mbits) - 1)
    if e == 0:
        return m * 2.0 ** (1 - bias - mbits)
    return (2**mbits + m) * 2.0 ** (e - bias - mbits)


def reference(x, ebits, mbits, bias, maxcode):
    """Nearest-even saturating narrowing of float32 x (finite or not), as
    codes without the sign; NaN inputs give -1. float64 holds every
    difference below exactly (at most ~40 significant bits)."""
    vals = np.array([value(c, ebits, mbits, bias) for c in range(maxcode + 1)])
    with np.errstate(invalid="ignore"):  # signalling NaNs widened
        a = np.abs(x.astype(np.float64))
    out = np.full(a.shape, -1, dtype=np.int64)
    fin = ~np.isnan(a)
    big = fin & (a >= vals[-1])
    out[big] = maxcode
    mid = fin & ~big
    am = a[mid]
    hi = np.searchsorted(vals, am, side="left")  # vals[hi] >= am, hi <= maxcode
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = am - vals[lo], vals[hi] - am
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(vals[hi] == am, hi, pick)
    out[mid] = pick
    return out


def narrow(x, name, fp8, ebits, mbits, bias, maxcode, has_inf):
    fmax = float(value(maxcode, ebits, mbits, bias))
    raw = x.astype(fp8).view(np.uint8)
    got = np.clip(x, np.float32(-fmax), np.float32(fmax)).astype(fp8).view(np.uint8)
    nan_in = np.isnan(x)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    mag = got & 0x7F

    # NaN stays NaN, with its sign
    nan_out = (mag == 0x7F) if not has_inf else (mag > 0x7C)
    assert np.array_equal(nan_in, nan_out), name + ": NaN in != NaN out"
    assert np.array_equal(got & 0x80, sign), name + ": a sign was lost"

    # clipping first == rounding first, then saturating what overflowed:
    # above max, ml_dtypes gives max (up to the tie) or its overflow value
    over = ~nan_in & (np.abs(x) > fmax)
    assert np.array_equal(raw[~over & ~nan_in], got[~over & ~nan_in]), name + ": clip moved a value in range"
    rmag = raw[over] & 0x7F
    if has_inf:
        assert np.all((rmag == 0x7C) | (rmag == maxcode)), name + ": raw overflow is not inf or max"
    else:
        assert np.all((rmag == 0x7F) | (rmag == maxcode)), name + ": raw overflow is not NaN or max"
    assert np.all(mag[over] == maxcode), name + ": overflow did not saturate"

    # one rounding, nearest even, from the value itself
    ref = reference(x, ebits, mbits, bias, maxcode)
    assert np.array_equal(ref[~nan_in], mag[~nan_in].astype(np.int64)), name + ": differs from the reference"

    print(f"{name}: {int(nan_in.sum())} NaN, {int(over.sum())} saturated "
          f"({int((raw[over] != got[over]).sum())} of them overflow in ml_dtypes' own astype), "
          f"{int((mag[~nan_in] == 0).sum())} to zero")
    return got


def widen(name, fp8, ebits, mbits, bias, has_inf):
    codes = np.arange(256, dtype=np.uint8)
    f = codes.view(fp8).astype(np.float32)
    for c in range(256):
        ac, neg = c & 0x7F, bool(c & 0x80)
        nan = ac == 0x7F if not has_inf else ac > 0x7C
        if nan:
            assert np.isnan(f[c]) and np.signbit(f[c]) == neg, f"{name} {c:#x}: not a NaN"
            continue
        want = float("inf") if (has_inf and ac == 0x7C) else value(ac, ebits, mbits, bias)
        want = -want if neg else want
        assert float(f[c]) == want and np.signbit(f[c]) == neg, f"{name} {c:#x}: {f[c]} != {want}"
    return f.view(np.uint32).astype("<u4")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "base", "data")
    os.makedirs(out, exist_ok=True)
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}")
    x = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    for name, fp8, ebits, mbits, bias, maxcode, has_inf in FORMATS:
        got = narrow(x, name, fp8, ebits, mbits, bias, maxcode, has_inf)
        with open(os.path.join(out, f"bf16_to_{name}.bin"), "wb") as fh:
            fh.write(got.tobytes())
        bits = widen(name, fp8, ebits, mbits, bias, has_inf)
        with open(os.path.join(out, f"{name}_to_f32.bin"), "wb") as fh:
            fh.write(bits.tobytes())
    print("wrote", os.path.normpath(out))


if __name__ == "__main__":
    main()
