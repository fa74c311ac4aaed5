# The peers of `metrale-gpu bench moe_gemm`, on the same shapes and timed the same way (CUDA-graph
# replay, one set of all experts' weights per replay from a rotation larger than L2, median of
# device-event timings):
#  - torch._grouped_mm in BF16 with offs (rows in expert order, equal rows per expert);
#  - torch._scaled_grouped_mm in FP8 with row-wise scales, where this torch has it;
#  - FBGEMM's f8f8bf16_rowwise_grouped_stacked (FP8 row-wise) when fbgemm_gpu imports.
# Cases: "moe8_<kind>_t<T>" = 8 experts of N=14336, K=4096 at T = 64, 512, 2048 rows each;
# "moe128_<kind>_t<T>" = 128 experts of a 30B-A3B layer (hidden 2048, intermediate 768):
# gate_up, silu*mul, then down, at T = 64, 512. Writes JSON (rows keyed like ours) to --out and
# prints one line per case.
import argparse, json
import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=20)
args = p.parse_args()
dev = torch.device("cuda")
L2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)
res = {"torch": torch.__version__, "cuda": torch.version.cuda, "rows": []}


def graph_us(fn):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(0)
        torch.cuda.synchronize()
        graphs = []
        for i in range(rotation_count):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(i)
            graphs.append(g)
    for i in range(3):
        graphs[i % len(graphs)].replay()
    torch.cuda.synchronize()
    ts = []
    for i in range(args.iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record(); graphs[i % len(graphs)].replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def add(name, shape, us, weight_bytes, flops, how):
    row = {"name": name, "shape": shape, "us": us, "GBps": weight_bytes / us / 1e3,
           "TFLOPs": flops / us / 1e6, "how": how}
    res["rows"].append(row)
    print(json.dumps(row), flush=True)


def error(what, e):
    res.setdefault("errors", []).append(f"{what}: {str(e)[:200]}")
    print("error", what, str(e)[:200], flush=True)


try:
    import fbgemm_gpu.experimental.gen_ai  # noqa: F401  (registers torch.ops.fbgemm.*)
    fbgemm = torch.ops.fbgemm
except Exception as e:  # optional
    fbgemm = None
    res.setdefault("errors", []).append(f"fbgemm_gpu: {str(e)[:200]}")

rotation_count = 2
for (E, N, K, layer, tokens) in [(8, 14336, 4096, False, [64, 512, 2048]),
                                 (128, 768, 2048, True, [64, 512])]:
    mats = [(2 * N, K), (K, N)] if layer else [(N, K)]  # [out, in] per expert
    set_bytes = sum(E * o * i for (o, i) in mats)  # FP8 bytes; BF16 is twice
    for tok in tokens:
        rows = E * tok
        tag = "moe128" if layer else "moe8"
        shape = f"E{E} x {tok} rows, {N}x{K}"
        flops = 2 * rows * N * K * (3 if layer else 1)
        a = torch.randn(rows, K, device=dev, dtype=torch.bfloat16)
        offs = torch.arange(tok, rows + 1, tok, device=dev, dtype=torch.int32)
        # BF16 torch._grouped_mm
        try:
            rotation_count = max(2, int(4 * L2 // (2 * set_bytes)) + 1)
            ws = [[torch.randn(E, o, i, device=dev, dtype=torch.bfloat16) for (o, i) in mats]
                  for _ in range(rotation_count)]

            def bf16(i):
                w = ws[i]
                y = torch._grouped_mm(a, w[0].transpose(-2, -1), offs=offs)
                if layer:
                    h = torch.nn.functional.silu(y[:, :N]) * y[:, N:]
                    torch._grouped_mm(h, w[1].transpose(-2, -1), offs=offs)
            add(f"{tag}_bf16_t{tok}", shape, graph_us(bf16), 2 * set_bytes, flops,
                "torch._grouped_mm BF16")
            del ws
        except Exception as e:
            error(f"{tag}_bf16_t{tok}", e)
        # FP8 row-wise: torch._scaled_grouped_mm (activation quantized per row in the timing)
        if hasattr(torch, "_scaled_grouped_mm"):
            try:
                rotation_count = max(2, int(4 * L2 // set_bytes) + 1)
                ws = [[(torch.randn(E, o, i, device=dev).to(torch.float8_e4m3fn),
                        torch.rand(E, o, device=dev) * 0.01 + 0.001) for (o, i) in mats]
                      for _ in range(rotation_count)]

                def quant(x):
                    s = x.abs().amax(dim=1).float().clamp(min=1e-12) / 448.0
                    return (x.float() / s[:, None]).to(torch.float8_e4m3fn), s

                def fp8(i):
                    w = ws[i]
                    q, s = quant(a)
                    y = torch._scaled_grouped_mm(q, w[0][0].transpose(-2, -1), s, w[0][1],
                                                 offs=offs, out_dtype=torch.bfloat16)
                    if layer:
                        h = torch.nn.functional.silu(y[:, :N]) * y[:, N:]
                        q2, s2 = quant(h)
                        torch._scaled_grouped_mm(q2, w[1][0].transpose(-2, -1), s2, w[1][1],
                                                 offs=offs, out_dtype=torch.bfloat16)
                add(f"{tag}_fp8_rowwise_t{tok}", shape, graph_us(fp8), set_bytes, flops,
                    "torch._scaled_grouped_mm FP8 row-wise (+ per-row quantization)")
                del ws
            except Exception as e:
                error(f"{tag}_fp8_rowwise_t{tok} (torch)", e)
        if fbgemm is not None and not layer:
            try:
                rotation_count = max(2, int(4 * L2 // set_bytes) + 1)
                ws = [(torch.randn(E * N, K, device=dev).to(torch.float8_e4m3fn),
                       torch.rand(E * N, device=dev) * 0.01 + 0.001)
                      for _ in range(rotation_count)]
                sizes = torch.full((E,), tok, device=dev, dtype=torch.int64)
                q = a.to(torch.float8_e4m3fn)
                xs = torch.rand(rows, device=dev) * 0.01 + 0.001

                def fb(i):
                    w, s = ws[i]
                    fbgemm.f8f8bf16_rowwise_grouped_stacked(q, w, xs, s, sizes)
                add(f"{tag}_fp8_rowwise_t{tok}.fbgemm", shape, graph_us(fb), set_bytes, flops,
                    "fbgemm f8f8bf16_rowwise_grouped_stacked (activation pre-quantized)")
                del ws
            except Exception as e:
                error(f"{tag}_fp8_rowwise_t{tok} (fbgemm)", e)
json.dump(res, open(args.out, "w"), indent=1)
