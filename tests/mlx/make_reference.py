"""Writes an MLX-quantized checkpoint and MLX's own results for it, the independent reference
of tests/test_mlx_reference.c. Everything is made by MLX itself: mx.quantize packs the weights,
mx.save_safetensors writes them, mx.dequantize and mx.quantized_matmul give the results.

Usage: make_reference.py OUT_DIR

OUT_DIR/model/            the checkpoint: model.safetensors, config.json
OUT_DIR/sharded/          the same layers in two shards with model.safetensors.index.json
OUT_DIR/reference.safetensors
    <layer>.dequant       mx.dequantize, cast to BF16 (exact for BF16 scales)
    <layer>.x             BF16 activations [M, K], M = 5 (GEMV) and <layer>.x_gemm [37, K]
    <layer>.y, .y_gemm    mx.quantized_matmul(x, W, transpose=True) in FP32, rounded to BF16
    <layer>.g, .u, .y_silu    silu_gate: quantized_matmul(silu(g) * u)
    <layer>.y_bias, .y_gemm_bias  for the layer made by nn.QuantizedLinear(bias=True) only: its
                          output with its own bias, MLX's rounding in BF16 (the product
                          rounded to BF16, then `+ bias` in BF16)
    <layer>.source        the BF16 or FP16 weights mx.quantize packed into the layer
    quantize.<bits>.<group>.<dtype>.{source,weight,scales,biases}
                          mx.quantize of rows chosen for its edge cases (zeros, constants, ties,
                          values below its 1e-7 scale floor, one end far larger than the other)
OUT_DIR/layers.txt        one line per layer: name experts n k bits group_size dtype
OUT_DIR/quantize.txt      one line per edge case: name rows k bits group_size dtype
"""
import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn

N, K, M, M_GEMM, EXPERTS = 72, 384, 5, 37, 3


def layer_cases():
    for bits in (4, 8):
        for group in (32, 64, 128):
            for dtype in ("bfloat16", "float16"):
                yield f"model.layers.{len(list_cases)}.proj", bits, group, dtype, 1
                list_cases.append(None)
    yield "model.layers.moe.mlp.switch_mlp.up_proj", 4, 64, "bfloat16", EXPERTS
    yield BIASED, 8, 64, "bfloat16", 1


BIASED = "model.layers.biased.o_proj"


list_cases = []


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    mx.random.seed(20261130)
    weights, ref, overrides, lines = {}, {}, {}, []
    for name, bits, group, dtype_name, experts in layer_cases():
        dtype = getattr(mx, dtype_name)
        shape = (experts, N, K) if experts > 1 else (N, K)
        w = (mx.random.normal(shape) * 0.05).astype(dtype)
        wq, scales, biases = mx.quantize(w, group_size=group, bits=bits)
        if name == BIASED:
            # MLX's own quantized layer with a bias: its packing and its `bias` tensor.
            lin = nn.Linear(K, N, bias=True)
            lin.weight = w
            lin.bias = (mx.random.normal((N,)) * 0.5).astype(dtype)
            ql = nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits)
            wq, scales, biases = ql.weight, ql.scales, ql["biases"]
            weights[name + ".bias"] = ql.bias
        ref[name + ".source"] = w
        weights[name + ".weight"] = wq
        weights[name + ".scales"] = scales
        weights[name + ".biases"] = biases
        overrides[name] = {"group_size": group, "bits": bits}
        lines.append(f"{name} {experts} {N} {K} {bits} {group} {dtype_name}")
        deq = mx.dequantize(wq, scales, biases, group_size=group, bits=bits)
        ref[name + ".dequant"] = deq.astype(mx.bfloat16)
        # The products are MLX's quantized_matmul in FP32 on the same packed weights, with the
        # scales and biases converted exactly to FP32: the op's definition (FP32 accumulation
        # of scale * q + bias). MLX's own BF16 CPU quantized_matmul is not used: it loses
        # about 3% (it does not accumulate in FP32), far more than BF16 rounding.
        e_wq, e_s, e_b = (wq[0], scales[0], biases[0]) if experts > 1 else (wq, scales, biases)
        e_s, e_b = e_s.astype(mx.float32), e_b.astype(mx.float32)

        def qmm(a):
            y = mx.quantized_matmul(a.astype(mx.float32), e_wq, e_s, e_b, transpose=True,
                                    group_size=group, bits=bits)
            return y.astype(mx.bfloat16)

        x = mx.random.normal((M, K)).astype(mx.bfloat16)
        xg = mx.random.normal((M_GEMM, K)).astype(mx.bfloat16)
        g = (mx.random.normal((M, K)) * 2).astype(mx.bfloat16)
        u = mx.random.normal((M, K)).astype(mx.bfloat16)
        h = (g.astype(mx.float32) * mx.sigmoid(g.astype(mx.float32)) * u.astype(mx.float32))
        ref[name + ".x"], ref[name + ".y"] = x, qmm(x)
        ref[name + ".x_gemm"], ref[name + ".y_gemm"] = xg, qmm(xg)
        ref[name + ".g"], ref[name + ".u"] = g, u
        ref[name + ".y_silu"] = qmm(h.astype(mx.bfloat16))
        if name == BIASED:
            # nn.QuantizedLinear's forward is quantized_matmul then `+ bias`: the same here,
            # with the product in FP32 as above and the bias added in BF16 as MLX does.
            ref[name + ".y_bias"] = qmm(x) + ql.bias
            ref[name + ".y_gemm_bias"] = qmm(xg) + ql.bias
            # ...and that is what the module computes (its FP32 form, checked here).
            f32 = nn.QuantizedLinear(K, N, bias=True, group_size=group, bits=bits)
            f32.update({"weight": wq, "scales": e_s, "biases": e_b,
                        "bias": ql.bias.astype(mx.float32)})
            want = mx.quantized_matmul(x.astype(mx.float32), wq, e_s, e_b, transpose=True,
                                       group_size=group, bits=bits) + ql.bias.astype(mx.float32)
            assert mx.allclose(f32(x.astype(mx.float32)), want, rtol=0, atol=0).item()
    quantize_lines = quantize_edges(ref)
    config = {"model_type": "test",
              "quantization": {"group_size": 64, "bits": 4, "mode": "affine", **overrides}}
    config["quantization_config"] = config["quantization"]
    meta = {"format": "mlx"}
    mx.save_safetensors(os.path.join(out, "model", "model.safetensors"), weights, metadata=meta)
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, keys in shards.items():
        mx.save_safetensors(os.path.join(out, "sharded", file), {k: weights[k] for k in keys},
                            metadata=meta)
        weight_map.update({k: file for k in keys})
    with open(os.path.join(out, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    for d in ("model", "sharded"):
        with open(os.path.join(out, d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    mx.save_safetensors(os.path.join(out, "reference.safetensors"), ref)
    with open(os.path.join(out, "layers.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "quantize.txt"), "w") as f:
        f.write("\n".join(quantize_lines) + "\n")


def edge_rows(k):
    """Rows of k values on which mx.quantize's arithmetic takes each of its branches."""
    grid = (mx.arange(k) % 16).astype(mx.float32)
    rows = [
        mx.zeros((k,)),                                 # every scale at its 1e-7 floor, q0 = 0
        mx.full((k,), 0.3), mx.full((k,), -0.3),        # constant groups
        mx.where(mx.arange(k) % 2 == 0, 0.5, -0.5),     # |lo| = |hi|: the high end kept exact
        mx.random.normal((k,)) * 1e-9,                  # the range below the scale floor
        mx.random.normal((k,)) * 1000,                  # large values (FP16 holds them)
        mx.where(mx.arange(k) % 37 == 5, 5.0, mx.random.normal((k,)) * 0.01),  # an outlier
        mx.random.normal((k,)) - 2.0,                   # negative groups
        grid / 15, grid / 15 - 0.5, grid * 0.1 + 0.05,  # values on or between the codes: ties
        mx.random.uniform(shape=(k,)),                  # lo near 0, hi near 1
        mx.where(mx.arange(k) % 3 == 0, -0.0, 0.0),     # signed zeros
        mx.random.normal((k,)),
    ]
    return mx.stack(rows)


def quantize_edges(ref):
    lines = []
    k = 256
    for dtype_name in ("bfloat16", "float16"):
        src = edge_rows(k).astype(getattr(mx, dtype_name))
        for bits in (4, 8):
            for group in (32, 64, 128):
                name = f"quantize.{bits}.{group}.{dtype_name}"
                wq, scales, biases = mx.quantize(src, group_size=group, bits=bits)
                ref[name + ".source"], ref[name + ".weight"] = src, wq
                ref[name + ".scales"], ref[name + ".biases"] = scales, biases
                lines.append(f"{name} {src.shape[0]} {k} {bits} {group} {dtype_name}")
    return lines


if __name__ == "__main__":
    main()
