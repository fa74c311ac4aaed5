# The shapes of `metrale-gpu bench gemm_decode` through PyTorch, timed the same way: CUDA-graph
# replay of one GEMM per weight of a rotation larger than L2. BF16 is torch.matmul (cuBLAS);
# FP8 is torch._scaled_mm with row-wise or per-tensor scales, which needs M to be a multiple
# of 16: rows with a smaller M run it padded to 16 (what an engine on PyTorch does) and say so
# in their name. Writes JSON rows keyed like ours ("<kind>_torch", "MxNxK") to --out.
import argparse, json, math
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=30)
p.add_argument("--m", default="1,2,4,8,16")
args = p.parse_args()
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
L2 = getattr(props, "L2_cache_size", 0) or (50 << 20)


def median_us(fn, iters):
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def graph_us(fn, iters):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    return median_us(g.replay, iters)


n_copy = 1 << 30
a = torch.empty(n_copy, dtype=torch.uint8, device=dev).random_(); b = torch.empty_like(a)
copy_gbps = 2 * n_copy / median_us(lambda: b.copy_(a), 20) / 1e3
del a, b

rows = []
shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1024, 4096),
          (128256, 4096), (576, 576), (3072, 576), (576, 1536)]
ms = [int(x) for x in args.m.split(",") if x]
for (n, k) in shapes:
    for m in ms:
        for kind, elem in [("bf16", 2), ("fp8_row", 1), ("fp8_tensor", 1)]:
            wbytes = n * k * elem
            R = max(4, math.ceil(2 * L2 / wbytes))
            mm = m if elem == 2 or m % 16 == 0 else 16
            name = f"{kind}_torch" + ("" if mm == m else "_m16")
            row = {"bench": "gemm_decode", "name": name, "shape": f"{m}x{n}x{k}", "timing": "graph"}
            try:
                x = torch.randn(mm, k, device=dev, dtype=torch.bfloat16)
                ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(R)]
                out = torch.empty(mm, n, device=dev, dtype=torch.bfloat16)
                if elem == 2:
                    def f():
                        for w in ws:
                            torch.matmul(x, w.t(), out=out)
                else:
                    x8 = x.to(torch.float8_e4m3fn)
                    ws = [w.to(torch.float8_e4m3fn) for w in ws]
                    if kind == "fp8_row":
                        sa = torch.ones(mm, 1, device=dev); sb = torch.ones(1, n, device=dev)
                    else:
                        sa = torch.tensor(1.0, device=dev); sb = torch.tensor(1.0, device=dev)
                    def f():
                        for w in ws:
                            torch._scaled_mm(x8, w.t(), scale_a=sa, scale_b=sb,
                                             out_dtype=torch.bfloat16)
                us = graph_us(f, args.iters)
                row.update({"median_us": us, "per_item_us": us / R,
                            "gbps": R * wbytes / us / 1e3,
                            "fraction_of_copy": R * wbytes / us / 1e3 / copy_gbps})
            except Exception as e:
                row["error"] = str(e)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
            ws = None
            torch.cuda.empty_cache()

json.dump({"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "copy_gbps_rw": copy_gbps, "rows": rows}, open(args.out, "w"), indent=1)
print(f"copy {copy_gbps:.0f} GB/s (read + written)")
