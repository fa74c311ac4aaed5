"""Exact host conversions for NumPy users (BF16 and FP8 E4M3 have no NumPy dtype): BF16
travels as uint16 bits, FP8 as uint8 codes. The library's own conversions (metrale/dtype.h)
define the same values."""
import numpy as np


def bf16_from_f32(x):
    """float32 -> BF16 bits (uint16), round to nearest even; NaN stays a quiet NaN."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def bf16_to_f32(bits):
    """BF16 bits (uint16) -> float32, exact."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table():
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e = (codes >> 3) & 0xF
    m = codes & 7
    value = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value


E4M3_VALUES = _e4m3_table()


def fp8_e4m3_to_f64(codes):
    """E4M3 codes (uint8) -> float64, exact (0x7f / 0xff are NaN)."""
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]
