#!/usr/bin/env python3
"""PyTorch figures for `metrale-gpu run` (src/model/model.h): the same dense decoder, the same
preset shapes and the same weights, timed the way the run reports itself.

    python3 bench/peers/peers_forward.py --out peers_forward.json [--preset llama-3-8b]

Weights: the splitmix64 formula of src/model/model.h, computed on the GPU in int64 arithmetic
(wrapping multiplies, masked shifts for the logical ones) and checked element for element
against a plain Python evaluation of the formula on a sample of every tensor before use; so
the peer multiplies the very BF16 weights metrale generates for the same --seed.

Model (Llama-style, BF16, no biases): embedding gather; per layer rmsnorm -> q = a Wq^T,
[k v] = a Wkv^T -> RoPE (rotate-half, theta of the preset) -> KV cache [B, Hkv, len, D] ->
SDPA (GQA) -> h += o Wo^T -> rmsnorm -> [g u] = m Wgu^T -> h += (silu(g) * u) Wdown^T; final
rmsnorm of the last token, LM head, argmax. Everything torch eager ops (cuBLAS GEMMs, SDPA's
automatic backend); the CUDA-graph rows capture one whole decode step.

Rows (for bench/peers/report.py; keys as the metrale run's figures):
  forward/<preset>/decode_b<B>.eager   ms per decode step at batch B, context --context
  forward/<preset>/decode_b<B>.graph   the same step replayed from one CUDA graph
  forward/<preset>/prefill             tokens/s of one prompt of mg_fwd_prompt_length(prompt_len,
                                       request 0) tokens (384 for --prompt-len 512), causal SDPA
Decode steps run at a fixed context (every request --context cached tokens, the cache filled
with the keys and values of random activations: the step's cost does not depend on them).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from peers_copy_launch import event_median_us  # same timing as every peer script

# The dense presets of src/model/model.c.
PRESETS = {
    "tiny": dict(hidden=256, heads=4, kv_heads=2, head_dim=128, intermediate=512, vocab=1024,
                 layers=2, rope_theta=10000.0, eps=1e-5),
    "small": dict(hidden=512, heads=8, kv_heads=2, head_dim=128, intermediate=1536, vocab=4096,
                  layers=4, rope_theta=10000.0, eps=1e-5),
    "llama-3-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                       vocab=128256, layers=32, rope_theta=500000.0, eps=1e-5),
}

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def signed64(x):
    x &= M64
    return x - (1 << 64) if x >> 63 else x


# ------------------------------------------------------------------ weights (model.h formula)

def splitmix64_py(x):
    x = (x + GOLDEN) & M64
    z = ((x ^ (x >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def f32(x):
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]


def bf16_bits_py(f):
    import struct
    u = struct.unpack("I", struct.pack("f", f))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def weight_py(seed, tid, offset, scale, index):
    """Element `index` of tensor `tid` as BF16 bits, plain Python (the formula's definition)."""
    z = splitmix64_py((seed * GOLDEN + (tid << 40) + index) & M64)
    u = f32(f32((z >> 40) * 2.0 ** -23) - 1.0)
    return bf16_bits_py(f32(offset + f32(scale * u)))


def lshr(x, s):
    """Logical right shift of int64 tensor x."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def weight_bits_torch(seed, tid, offset, scale, first, count, dev):
    """BF16 bits (int64 0..65535) of elements first .. first+count-1 of tensor `tid`."""
    idx = torch.arange(first, first + count, device=dev, dtype=torch.int64)
    x = idx + signed64(seed * GOLDEN + (tid << 40))
    x = x + signed64(GOLDEN)
    z = (x ^ lshr(x, 30)) * signed64(MIX1)
    z = (z ^ lshr(z, 27)) * signed64(MIX2)
    z = z ^ lshr(z, 31)
    u = lshr(z, 40).to(torch.float32) * (2.0 ** -23) - 1.0  # both steps exact
    v = torch.add(torch.mul(u, scale), offset)  # two roundings, as the C code
    b = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def tensor_meta(p, tid):
    """(rows, cols, offset, scale) of tensor `tid` (mg_fwd_tensor_shape)."""
    h, q, kv = p["hidden"], p["heads"] * p["head_dim"], 2 * p["kv_heads"] * p["head_dim"]
    if tid in (0, 2):
        rows, cols, norm = p["vocab"], h, False
    elif tid == 1:
        rows, cols, norm = 1, h, True
    else:
        slot = (tid - 16) % 8
        rows, cols, norm = {0: (1, h, True), 1: (q, h, False), 2: (kv, h, False),
                            3: (h, q, False), 4: (1, h, True),
                            5: (2 * p["intermediate"], h, False),
                            6: (h, p["intermediate"], False)}[slot]
    scale = 0.1 if norm else 1.0 if tid == 0 else f32(1.0 / f32(math.sqrt(cols)))
    return rows, cols, 1.0 if norm else 0.0, scale


def make_tensor(p, seed, tid, dev, chunk=1 << 26):
    rows, cols, offset, scale = tensor_meta(p, tid)
    n = rows * cols
    out = torch.empty(n, dtype=torch.int16, device=dev)
    for first in range(0, n, chunk):
        c = min(chunk, n - first)
        bits = weight_bits_torch(seed, tid, offset, scale, first, c, dev)
        out[first:first + c] = torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16)
    # the check: a sample of elements against the plain Python formula
    sample = sorted({0, 1, n // 3, n // 2 + 7, n - 1})
    got = out[torch.tensor(sample, device=dev)].to(torch.int64).cpu().tolist()
    want = [weight_py(seed, tid, offset, scale, i) for i in sample]
    got = [g & 0xFFFF for g in got]
    if got != want:
        raise SystemExit(f"weight generator disagrees with the formula on tensor {tid}: "
                         f"{got} vs {want}")
    return out.view(torch.bfloat16).view(rows, cols) if rows > 1 else out.view(torch.bfloat16)


# ------------------------------------------------------------------ the model

def rms_norm(x, weight, eps):
    """F.rms_norm where this PyTorch has it (2.4 on), else the same in plain ops."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class Model:
    def __init__(self, p, seed, dev):
        self.p = p
        L = p["layers"]
        self.emb = make_tensor(p, seed, 0, dev)
        self.final_norm = make_tensor(p, seed, 1, dev)
        self.lm = make_tensor(p, seed, 2, dev)
        self.layers = [[make_tensor(p, seed, 16 + 8 * l + s, dev) for s in range(7)]
                       for l in range(L)]
        D = p["head_dim"]
        self.inv_freq = (p["rope_theta"] ** (-torch.arange(0, D, 2, device=dev,
                                                           dtype=torch.float64) / D)).float()

    def rope(self, x, pos):
        """x [B, H, T, D], pos [B, T] int64 -> rotate-half RoPE."""
        ang = pos.to(torch.float32)[:, None, :, None] * self.inv_freq  # [B,1,T,D/2]
        cos, sin = ang.cos(), ang.sin()
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).to(x.dtype)

    def step(self, ids, pos, kcache, vcache, valid):
        """ids [B, T]; pos [B, T]; caches [L][B, Hkv, S, D]; valid [B, 1, T, S] bool mask.
        Writes the new keys/values at `pos` and returns the greedy ids of the last tokens."""
        p = self.p
        B, T = ids.shape
        H, Hq, Hkv, D, I = p["hidden"], p["heads"], p["kv_heads"], p["head_dim"], p["intermediate"]
        eps = p["eps"]
        h = F.embedding(ids, self.emb)
        for l, (an, wq, wkv, wo, mn, wgu, wd) in enumerate(self.layers):
            a = rms_norm(h, an, eps)
            q = (a @ wq.t()).view(B, T, Hq, D).transpose(1, 2)
            kv = (a @ wkv.t()).view(B, T, 2, Hkv, D)
            k = kv[:, :, 0].transpose(1, 2)
            v = kv[:, :, 1].transpose(1, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            slot = pos[:, None, :, None].expand(B, Hkv, T, D)
            kcache[l].scatter_(2, slot, k)
            vcache[l].scatter_(2, slot, v)
            o = F.scaled_dot_product_attention(q, kcache[l], vcache[l], attn_mask=valid,
                                               enable_gqa=True)
            h = h + o.transpose(1, 2).reshape(B, T, Hq * D) @ wo.t()
            m = rms_norm(h, mn, eps)
            gu = m @ wgu.t()
            h = h + (F.silu(gu[..., :I]) * gu[..., I:]) @ wd.t()
        last = rms_norm(h[:, -1], self.final_norm, eps)
        return (last @ self.lm.t()).float().argmax(-1)


def graph_median_us(fn, iters, warmup=3):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return event_median_us(graph.replay, iters, warmup)


def prompt_length(prompt_len, r):
    n = prompt_len - prompt_len // 4 + (r * 37) % (prompt_len // 2 + 1)
    return max(n, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="llama-3-8b", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    p = PRESETS[args.preset]
    t0 = time.time()
    model = Model(p, args.seed, dev)
    torch.cuda.synchronize()
    setup_s = time.time() - t0
    print(f"weights generated and checked in {setup_s:.1f} s", flush=True)
    L, Hkv, D = p["layers"], p["kv_heads"], p["head_dim"]
    rows = {}
    how = (f"PyTorch {torch.__version__}: BF16 eager ops (cuBLAS, SDPA), the model.h weights "
           f"(seed {args.seed})")

    # prefill: request 0's prompt, causal
    T = prompt_length(args.prompt_len, 0)
    ids = torch.randint(0, p["vocab"], (1, T), device=dev)
    pos = torch.arange(T, device=dev)[None]
    kc = [torch.zeros(1, Hkv, T, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
    vc = [torch.zeros_like(x) for x in kc]
    causal = torch.ones(T, T, device=dev, dtype=torch.bool).tril()[None, None]
    with torch.inference_mode():
        us = event_median_us(lambda: model.step(ids, pos, kc, vc, causal), max(3, args.iters // 4), 2)
    rows[f"forward/{args.preset}/prefill"] = {
        "metric": "tokens_per_s", "value": T / us * 1e6, "how": how + f", one prompt of {T} tokens"}
    print(f"prefill {T} tokens: {us / 1e3:.2f} ms, {T / us * 1e6:.0f} tokens/s", flush=True)
    del kc, vc
    torch.cuda.empty_cache()

    # decode: every request at --context cached tokens, one new token each
    for B in [int(b) for b in args.batches.split(",") if b]:
        S = args.context + 1
        kc = [torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
        vc = [torch.randn_like(x) for x in kc]
        ids = torch.randint(0, p["vocab"], (B, 1), device=dev)
        pos = torch.full((B, 1), args.context, device=dev, dtype=torch.int64)
        valid = torch.ones(B, 1, 1, S, device=dev, dtype=torch.bool)
        fn = lambda: model.step(ids, pos, kc, vc, valid)  # noqa: E731
        with torch.inference_mode():
            eager = event_median_us(fn, args.iters, 3)
            try:
                graph = graph_median_us(fn, args.iters)
            except Exception as e:  # noqa: BLE001 - record why the graph row is missing
                graph = None
                rows[f"forward/{args.preset}/decode_b{B}.graph_error"] = {
                    "metric": "info", "value": None, "how": str(e)[:200]}
        for mode, us in (("eager", eager), ("graph", graph)):
            if us is not None:
                rows[f"forward/{args.preset}/decode_b{B}.{mode}"] = {
                    "metric": "ms_per_step", "value": us / 1e3,
                    "how": how + f", batch {B}, context {args.context}, {mode}"}
        print(f"decode b{B}: eager {eager / 1e3:.3f} ms/step, graph "
              f"{'-' if graph is None else f'{graph / 1e3:.3f}'} ms/step", flush=True)
        del kc, vc
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
               "preset": args.preset, "weights": "model.h splitmix64 (bit-identical BF16)",
               "setup_s": setup_s, "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
