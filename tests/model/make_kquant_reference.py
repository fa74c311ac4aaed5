"""make_kquant_reference.py - writes the K-quant block references of tests/test_gguf_blocks.c.

For each of Q4_K, Q5_K and Q6_K: tests/model/kquants/<TYPE>.bin holds the block count (uint32),
random blocks (a count that is no power of two), then their FP32 dequantization by the pinned
gguf package's `gguf.quants.dequantize`, the independent reference. The FP16 scale fields are
drawn finite (random bytes elsewhere), so the comparison can be bit-exact. Run it with
.venv-model's python (tests/model/venv_pins.sh pins gguf==0.19.0).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kquants")
# offsets of the FP16 fields in each block (ggml's block_q4_K, block_q5_K, block_q6_K)
F16_FIELDS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def main():
    rng = np.random.default_rng(20261203)
    os.makedirs(OUT, exist_ok=True)
    for t, fields in F16_FIELDS.items():
        elems, size = GGML_QUANT_SIZES[t]
        blocks = 13
        raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
        for b in range(blocks):
            for off in fields:
                # finite, both signs, from subnormal to large magnitudes
                v = np.float16(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-20, 8))
                raw[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        ref = dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
        assert ref.size == blocks * elems and np.isfinite(ref).all()
        with open(os.path.join(OUT, t.name + ".bin"), "wb") as f:
            f.write(np.uint32(blocks).tobytes())
            f.write(raw.tobytes())
            f.write(ref.tobytes())
        print(t.name, blocks, "blocks")


if __name__ == "__main__":
    sys.exit(main())
