# The peers of `metrale-gpu bench nvfp4`, timed the same way (CUDA-graph replay of one GEMM per
# weight of a rotation larger than L2, median of device-event timings):
#  - torch.matmul in BF16 on the dense shapes;
#  - torch._weight_int4pack_mm (int4 weight-only, group 128) where this torch has it;
#  - torch._grouped_mm in BF16 for the grouped shapes (8 experts of 14336x4096; 128 experts of
#    a 30B-A3B layer: gate_up then down), where this torch has it.
# Writes JSON to --out and prints one line per case.
import argparse, json
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=20)
p.add_argument("--m", default="1,2,4,8,16,64,256")
args = p.parse_args()
dev = torch.device("cuda")
L2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)


def graph_us(fn, calls):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(args.iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2] / calls


def rotation(nbytes):
    return max(2, int(4 * L2 // max(nbytes, 1)) + 1)


res = {"torch": torch.__version__, "rows": []}


def add(name, shape, us, weight_bytes, flops):
    row = {"name": name, "shape": shape, "us": us, "GBps": weight_bytes / us / 1e3,
           "TFLOPs": flops / us / 1e6}
    res["rows"].append(row)
    print(json.dumps(row), flush=True)


ms = [int(x) for x in args.m.split(",") if x]
for (N, K) in [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096)]:
    R = rotation(N * K * 2)
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(R)]
    for M in ms:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        us = graph_us(lambda: [torch.matmul(a, w.t()) for w in ws], R)
        add("torch_bf16", f"{M}x{N}x{K}", us, N * K * 2, 2 * M * N * K)
        if hasattr(torch, "_weight_int4pack_mm") and M <= 64:
            try:
                gs = 128
                Ri = rotation(N * K // 2)
                wp = [torch._convert_weight_to_int4pack(
                    torch.randint(0, 256, (N, K // 2), device=dev, dtype=torch.uint8), 8)
                    for _ in range(Ri)]
                sz = torch.randn(K // gs, N, 2, device=dev, dtype=torch.bfloat16)
                us = graph_us(lambda: [torch._weight_int4pack_mm(a, w, gs, sz) for w in wp], Ri)
                add("torch_int4pack", f"{M}x{N}x{K}", us, N * K // 2 + K // gs * N * 4,
                    2 * M * N * K)
                del wp
            except Exception as e:  # a torch without the kernel for this shape
                res.setdefault("errors", []).append(f"int4pack {M}x{N}x{K}: {str(e)[:200]}")
    a = torch.randn(4096, K, device=dev, dtype=torch.bfloat16)
    us = graph_us(lambda: torch.matmul(a, ws[0].t()), 1)
    add("torch_bf16", f"4096x{N}x{K}", us, N * K * 2, 2 * 4096 * N * K)
    del ws

if hasattr(torch, "_grouped_mm"):
    for (E, N, K, fused) in [(8, 14336, 4096, False), (128, 768, 2048, True)]:
        for tok in [1, 8, 64, 512]:
            if E == 8 and tok <= 8:  # a device-side assert under capture in torch 2.11
                res.setdefault("errors", []).append(f"grouped E8 tok{tok}: skipped (torch assert)")
                continue
            try:
                rows = E * tok
                a = torch.randn(rows, K, device=dev, dtype=torch.bfloat16)
                offs = torch.arange(tok, rows + 1, tok, device=dev, dtype=torch.int32)
                if fused:
                    wgu = torch.randn(E, 2 * N, K, device=dev, dtype=torch.bfloat16)
                    wd = torch.randn(E, K, N, device=dev, dtype=torch.bfloat16)

                    def f():
                        y = torch._grouped_mm(a, wgu.transpose(-2, -1), offs=offs)
                        h = torch.nn.functional.silu(y[:, :N]) * y[:, N:]
                        torch._grouped_mm(h, wd.transpose(-2, -1), offs=offs)
                    wbytes = E * 3 * N * K * 2
                    flops = 2 * rows * 3 * N * K
                else:
                    w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)

                    def f():
                        torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
                    wbytes = E * N * K * 2
                    flops = 2 * rows * N * K
                us = graph_us(f, 1)
                add("torch_grouped_mm", f"E{E} x {tok} rows, {N}x{K}", us, wbytes, flops)
            except Exception as e:
                res.setdefault("errors", []).append(f"grouped E{E} tok{tok}: {str(e)[:200]}")
                print("grouped_mm error", E, tok, str(e)[:200], flush=True)
json.dump(res, open(args.out, "w"), indent=1)
