# PyTorch peers of `metrale-gpu bench mlx`: for each of its cases, the same product in PyTorch
# BF16 (torch.matmul; silu_gate as silu(g) * u then matmul; gate_up as one matmul on the two
# weights concatenated), and for 8 bits torch._weight_int8pack_mm (int8 weight-only, per-row
# scales) when this PyTorch has it. Timed like ours: CUDA-graph replay of one call per weight of
# a rotation larger than 4x L2, median of --iters after --warmup, reported per call. Writes JSON
# {"rows": {"mlx/<case>": {"metric": "per_item_us", "value": ..., "target_ratio": ...}}} to
# --out; targets (ours vs torch BF16, higher is better) follow the issue: M = 1 GEMVs 1.9x at 8
# bits and 3.3x at 4 bits, the GEMM at M = 4096 0.7x.
import argparse, json, math
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
args = p.parse_args()
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
L2 = getattr(props, "L2_cache_size", 0) or (50 << 20)


def events(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def graph_per_call(make_call, count):
    """Median microseconds per call of a graph holding `count` calls."""
    calls = [make_call(i) for i in range(count)]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for c in calls:
            c()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
    return events(g.replay, args.warmup, args.iters) / count


def rotation(weight_bytes):
    return max(2, min(64, math.ceil(4 * L2 / weight_bytes)))


rows = {}
how_bf16 = "torch.matmul BF16, graph replay over weights rotated past L2"


def add(case, us, target=None, how=how_bf16):
    r = {"metric": "per_item_us", "value": us, "how": how}
    if target:
        r["target_ratio"] = target
    rows[f"mlx/{case}"] = r
    print(json.dumps({case: r}), flush=True)


def bf16_case(kind, m, n, k):
    layers = 2 if kind == "gate_up" else 1
    R = rotation(layers * n * k * 2)
    ws = [torch.randn(layers * n, k, device=dev, dtype=torch.bfloat16) for _ in range(R)]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    u = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, layers * n, device=dev, dtype=torch.bfloat16)
    if kind == "silu_gate":
        make = lambda i: (lambda: torch.matmul(torch.nn.functional.silu(x) * u, ws[i].t(), out=out))
    else:
        make = lambda i: (lambda: torch.matmul(x, ws[i].t(), out=out))
    us = graph_per_call(make, R)
    del ws
    torch.cuda.empty_cache()
    return us


def int8pack_case(m, n, k):
    if not hasattr(torch, "_weight_int8pack_mm"):
        return None
    R = rotation(n * k)
    ws = [torch.randint(-128, 127, (n, k), device=dev, dtype=torch.int8) for _ in range(R)]
    sc = torch.rand(n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    try:
        us = graph_per_call(lambda i: (lambda: torch._weight_int8pack_mm(x, ws[i], sc)), R)
    except Exception as e:  # not built for CUDA in this PyTorch
        print(json.dumps({"int8pack": str(e)[:200]}), flush=True)
        us = None
    del ws
    torch.cuda.empty_cache()
    return us


cases = []
for bits in (8, 4):
    for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)]:
        for m in (1, 4, 16, 512, 4096):
            if m <= 8:
                cases.append(("gemv", bits, m, n, k))
            if m == 16:
                cases.append(("gemv_2x8", bits, m, n, k))
            if m >= 16:
                cases.append(("gemm", bits, m, n, k))
    cases.append(("silu_gate", bits, 1, 4096, 14336))
    cases.append(("gate_up", bits, 1, 14336, 4096))

bf16_cache, int8_cache = {}, {}
for kind, bits, m, n, k in cases:
    name = f"{kind}_{bits}bit.{m}x{n}x{k}"
    key = (kind if kind in ("silu_gate", "gate_up") else "plain", m, n, k)
    if key not in bf16_cache:
        bf16_cache[key] = bf16_case(key[0], m, n, k)
    target = None
    if m == 1:
        target = 1.9 if bits == 8 else 3.3
    elif kind == "gemm" and m == 4096:
        target = 0.7
    add(name, bf16_cache[key], target)
    if bits == 8 and kind not in ("silu_gate", "gate_up"):
        if (m, n, k) not in int8_cache:
            int8_cache[(m, n, k)] = int8pack_case(m, n, k)
        if int8_cache[(m, n, k)]:
            add(name + ".int8pack", int8_cache[(m, n, k)],
                how="torch._weight_int8pack_mm (int8 weights, per-row scales), graph replay")

json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
           "rows": rows}, open(args.out, "w"), indent=1)
