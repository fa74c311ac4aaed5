"""Writes the small MLX-quantized checkpoints committed under tests/mlx/checkpoints/: the layer
matrices of a model preset (src/model/model.h) made from the model's own deterministic weights
(model.h's generator, in plain Python) and quantized and written by MLX itself (mx.quantize, mx.save_safetensors), with a config.json
holding `quantization` as mlx-lm writes it. `metrale-gpu run --weights mlx8|mlx4` and
`metrale-gpu check mlx_model` load them.

Usage: make_checkpoint.py OUT_DIR [PRESET]   (the repository's files: tests/mlx/checkpoints)

OUT_DIR/<preset>-mlx8/ and <preset>-mlx4/: model.safetensors, config.json. Per layer l the
tensors model.layers.<l>.self_attn.{q,k,v,o}_proj and model.layers.<l>.mlp.{gate,up,down}_proj
(.weight U32, .scales and .biases BF16, group size 64): model.h's wq, the k rows and the v rows
of wkv, wo, the gate rows and the up rows of w_gate_up, w_down, generated for seed 1.
"""
import json
import os
import sys

import math
import struct

import mlx.core as mx

# The presets' shapes (src/model/model.h), for those small enough to commit.
PRESETS = {
    "micro": dict(hidden=128, heads=2, kv_heads=1, head_dim=128, intermediate=256, layers=2),
}
SEED = 1
GROUP = 64

MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def f32(x):
    """x rounded to single precision (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_rne(f):
    """A single-precision value -> the value of its BF16 rounding (nearest, ties to even)."""
    u = struct.unpack("<I", struct.pack("<f", f))[0]
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return struct.unpack("<f", struct.pack("<I", r << 16))[0]


def tensor(tensor_id, rows, cols):
    """model.h's weights of tensor `tensor_id` ([rows, cols], a matrix: offset 0, scale
    1/sqrt(cols) in single precision), as rows of BF16 values. Plain Python integers keep the
    generator's 64-bit arithmetic exact; every single-precision step is rounded as C rounds it
    (a product of two singles is exact in double, then rounded once)."""
    scale = f32(1.0 / f32(math.sqrt(cols)))
    base = (SEED * 0x9E3779B97F4A7C15 + (tensor_id << 40)) & MASK
    out = []
    for r in range(rows):
        row = []
        for c in range(cols):
            z = splitmix64((base + r * cols + c) & MASK)
            u = (z >> 40) * 2.0 ** -23 - 1.0  # exact in single precision
            row.append(bf16_rne(f32(scale * u)))
        out.append(row)
    return out


def layer_matrices(p, layer):
    h, q = p["hidden"], p["heads"] * p["head_dim"]
    kd, inter = p["kv_heads"] * p["head_dim"], p["intermediate"]
    tid = lambda slot: 16 + 8 * layer + slot
    wkv = tensor(tid(2), 2 * kd, h)
    wgu = tensor(tid(5), 2 * inter, h)
    pre = f"model.layers.{layer}."
    return {pre + "self_attn.q_proj": tensor(tid(1), q, h),
            pre + "self_attn.k_proj": wkv[:kd], pre + "self_attn.v_proj": wkv[kd:],
            pre + "self_attn.o_proj": tensor(tid(3), h, q),
            pre + "mlp.gate_proj": wgu[:inter], pre + "mlp.up_proj": wgu[inter:],
            pre + "mlp.down_proj": tensor(tid(6), h, inter)}


def main():
    out = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "micro"
    p = PRESETS[name]
    mats = {}
    for layer in range(p["layers"]):
        mats.update(layer_matrices(p, layer))
    for bits in (8, 4):
        d = os.path.join(out, f"{name}-mlx{bits}")
        os.makedirs(d, exist_ok=True)
        weights = {}
        for module, w in mats.items():
            wq, scales, biases = mx.quantize(mx.array(w, dtype=mx.float32).astype(mx.bfloat16), group_size=GROUP,
                                             bits=bits)
            weights[module + ".weight"] = wq
            weights[module + ".scales"] = scales
            weights[module + ".biases"] = biases
        mx.save_safetensors(os.path.join(d, "model.safetensors"), weights,
                            metadata={"format": "mlx"})
        quant = {"group_size": GROUP, "bits": bits, "mode": "affine"}
        config = {"model_type": "metrale", "metrale_preset": name, "metrale_seed": SEED,
                  "hidden_size": p["hidden"], "num_hidden_layers": p["layers"],
                  "num_attention_heads": p["heads"], "num_key_value_heads": p["kv_heads"],
                  "head_dim": p["head_dim"], "intermediate_size": p["intermediate"],
                  "quantization": quant, "quantization_config": quant}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
