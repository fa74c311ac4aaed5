# The cases of `metrale-gpu bench nvfp4_format` through PyTorch, timed as CUDA-graph replays with
# device events (median of --iters after --warmup), written as JSON rows keyed like ours
# ("nvfp4_format/<case>") for report.py:
#  - quantize / dequantize_bf16 of a 14336x4096 weight with plain tensor ops (the same rule:
#    block amax / 6 / global to E4M3, E2M1 by thresholds, two nibbles per byte), in GB/s over
#    the same bytes metrale counts (BF16 + packed + scales);
#  - route_T: softmax, topk, renormalise, a stable argsort of the expert ids and the offsets
#    (bincount + cumsum), E=128 k=8, median_us;
#  - combine_T: gather the rows by position, weight, sum over k in FP32, add the residual, GB/s.
import argparse, json
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=50)
p.add_argument("--warmup", type=int, default=10)
args = p.parse_args()
dev = torch.device("cuda")


def graph_us(fn):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    for _ in range(args.warmup):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(args.iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


rows = {}
N, K = 14336, 4096
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device=dev)
BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=dev)
g = torch.tensor(4.0 / 2688.0, device=dev)
x = (torch.rand(N, K, device=dev) * 8 - 4).to(torch.bfloat16)
packed = torch.randint(0, 256, (N, K // 2), device=dev, dtype=torch.uint8)
scales = torch.randint(0, 0x7f, (N, K // 16), device=dev, dtype=torch.uint8)
out_packed = torch.empty_like(packed); out_scales = torch.empty_like(scales)
out_bf16 = torch.empty(N, K, device=dev, dtype=torch.bfloat16)
format_bytes = N * K * 2 + N * K // 2 + N * K // 16


def quantize():
    blocks = x.float().view(N, K // 16, 16)
    s = (blocks.abs().amax(-1) / 6 / g).to(torch.float8_e4m3fn)
    d = (s.float() * g).unsqueeze(-1)
    m = torch.where(d > 0, blocks.abs() / d, torch.zeros_like(blocks))
    code = torch.bucketize(m, BOUNDS).to(torch.uint8) | ((blocks < 0).to(torch.uint8) << 3)
    code = code.view(N, K // 2, 2)
    out_packed.copy_(code[..., 0] | (code[..., 1] << 4))
    out_scales.copy_(s.view(torch.uint8))


def dequantize():
    lo = (packed & 0xf).long(); hi = (packed >> 4).long()
    v = torch.stack([E2M1[lo & 7] * (1 - 2 * (lo >> 3)), E2M1[hi & 7] * (1 - 2 * (hi >> 3))], -1)
    sc = scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1) * g
    out_bf16.copy_((v.view(N, K) * sc).to(torch.bfloat16))


for name, fn in [("quantize", quantize), ("dequantize_bf16", dequantize)]:
    us = graph_us(fn)
    rows[f"nvfp4_format/{name}"] = {"metric": "gbps", "value": format_bytes / us / 1e3,
                                    "how": "torch tensor ops, graph replay"}
del x, packed, scales, out_packed, out_scales, out_bf16
torch.cuda.empty_cache()

E, TOPK, H = 128, 8, 4096
for T in (1, 16, 4096):
    logits = torch.randn(T, E, device=dev).to(torch.bfloat16)
    offsets = torch.zeros(E + 1, device=dev, dtype=torch.int64)

    def route():
        w, ids = torch.topk(torch.softmax(logits.float(), -1), TOPK, -1)
        w = w / w.sum(-1, keepdim=True)
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        offsets[1:] = torch.cumsum(torch.bincount(flat, minlength=E), 0)
        return w, order // TOPK, order

    rows[f"nvfp4_format/route_{T}"] = {"metric": "median_us", "value": graph_us(route),
                                       "how": "softmax+topk+stable argsort+bincount, graph"}
    ex = torch.randn(T * TOPK, H, device=dev).to(torch.bfloat16)
    pos = torch.randperm(T * TOPK, device=dev)
    wts = torch.rand(T, TOPK, device=dev)
    res = torch.randn(T, H, device=dev).to(torch.bfloat16)

    def combine():
        acc = (ex[pos].view(T, TOPK, H).float() * wts.unsqueeze(-1)).sum(1) + res.float()
        res.copy_(acc.to(torch.bfloat16))

    bytes_moved = T * TOPK * H * 2 + 2 * T * H * 2 + T * TOPK * 8
    us = graph_us(combine)
    rows[f"nvfp4_format/combine_{T}"] = {"metric": "gbps", "value": bytes_moved / us / 1e3,
                                         "how": "gather, weight, sum in FP32, residual, graph"}

props = torch.cuda.get_device_properties(0)
json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
           "rows": rows}, open(args.out, "w"), indent=1)
print(json.dumps(rows, indent=1))
