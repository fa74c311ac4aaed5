# The shapes of `metrale-gpu bench gemm` through PyTorch (cuBLAS/cuBLASLt), timed the same way:
# eager rows with device events around one GEMM on fixed inputs (median of --iters after
# --warmup), decode rows as CUDA-graph replays of one GEMM per weight of a rotation larger than
# L2. Also measures the device-to-device copy bandwidth (bytes read + written), the ceiling of
# the decode rows. Writes JSON (rows keyed like ours) to --out.
import argparse, json, math, sys, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=50)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--m", default="1,16,64,128,256,4096,8192")
args = p.parse_args()
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
L2 = getattr(props, "L2_cache_size", 0) or 0


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


def graph(fn, warmup, iters):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    return events(g.replay, 0, iters)


def rand_bf16(*shape):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16)


rows = []
def add(name, m, n, k, timing, us, gemms=1, weight_bytes=0, err=None):
    r = {"name": name, "shape": f"{m}x{n}x{k}", "timing": timing}
    if err:
        r["error"] = err[:300]
    else:
        r.update({"median_us": us, "per_item_us": us / gemms,
                  "tflops": gemms * 2.0 * m * n * k / us / 1e6})
        if weight_bytes:
            r["gbps"] = gemms * weight_bytes / us / 1e3
    rows.append(r)
    print(json.dumps(r), flush=True)


# Ceiling of memory-bound rows: a large device-to-device copy.
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device=dev).random_(); b = torch.empty_like(a)
copy_us = events(lambda: b.copy_(a), 3, 20)
copy_gbps = 2 * n / copy_us / 1e3
del a, b

ms = [int(x) for x in args.m.split(",") if x]
shapes = [(m, n, k) for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)] for m in ms]
shapes += [(8192, 8192, 8192), (16384, 8192, 8192)]
one = torch.tensor(1.0, device=dev)
for (m, n, k) in shapes:
    x = rand_bf16(m, k); w = rand_bf16(n, k)
    add("bf16", m, n, k, "events", events(lambda: torch.matmul(x, w.t()), args.warmup, args.iters))
    x8 = x.to(torch.float8_e4m3fn); w8 = w.to(torch.float8_e4m3fn)
    try:
        add("fp8_tensor", m, n, k, "events", events(
            lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            args.warmup, args.iters))
    except Exception as e:
        add("fp8_tensor", m, n, k, "events", 0, err=str(e))
    try:
        sa = torch.ones(m, 1, device=dev); sb = torch.ones(1, n, device=dev)
        add("fp8_row", m, n, k, "events", events(
            lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
            args.warmup, args.iters))
    except Exception as e:
        add("fp8_row", m, n, k, "events", 0, err=str(e))
    if m % 4 == 0:
        try:  # 1x128 activation scales (tokens contiguous), 128x128 weight scales
            L = math.ceil(k / 128)
            sa = torch.ones(L, m, device=dev).t()
            sb = torch.ones(math.ceil(n / 128), L, device=dev).t()
            add("fp8_block", m, n, k, "events", events(
                lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                args.warmup, args.iters))
        except Exception as e:
            add("fp8_block", m, n, k, "events", 0, err=str(e))
    del x, w, x8, w8
    torch.cuda.empty_cache()

# Decode rows: graph replay over rotating weights, as bench_gemm.c does (at least 8 weights,
# together at least 4x L2).
for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)]:
    for m in [1, 16]:
        for name, elem in [("bf16_decode_graph", 2), ("fp8_tensor_decode_graph", 1)]:
            wbytes = n * k * elem
            R = max(8, min(64, math.ceil(4 * L2 / wbytes))) if L2 else 8
            x = rand_bf16(m, k)
            ws = [rand_bf16(n, k) for _ in range(R)]
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            try:
                if elem == 2:
                    def f():
                        for w in ws:
                            torch.matmul(x, w.t(), out=out)
                else:
                    x8 = x.to(torch.float8_e4m3fn)
                    ws = [w.to(torch.float8_e4m3fn) for w in ws]
                    def f():
                        for w in ws:
                            torch._scaled_mm(x8, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                add(name, m, n, k, "graph", graph(f, 3, args.iters), gemms=R, weight_bytes=wbytes)
            except Exception as e:
                add(name, m, n, k, "graph", 0, err=str(e))
            del ws
            torch.cuda.empty_cache()

json.dump({"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "l2_bytes": L2, "copy_gbps_rw": copy_gbps, "rows": rows},
          open(args.out, "w"), indent=1)
print(f"copy {copy_gbps:.0f} GB/s (read + written)")
