# Side-by-side table of `metrale-gpu bench gemm --json-out ours.json` and
# peers_gemm.py's JSON from the same call: ratio = PyTorch time / our time (>= 1.0: we are at
# least as fast), TFLOP/s, and the fraction of the ceiling: dense peak (BF16 989, FP8 1979
# TFLOP/s, datasheet) for eager rows, the measured device-copy bandwidth (bytes read + written)
# for decode rows' weight bytes.
import json, sys

ours = json.load(open(sys.argv[1]))
peers = json.load(open(sys.argv[2]))
copy = peers["copy_gbps_rw"]
peak = {"bf16": 989.0, "fp8": 1979.0}
index = {(r["name"], r["shape"], r["timing"]): r for r in peers["rows"]}

print(f"GPU: {ours['device']}, driver {ours['driver']}; PyTorch {peers['torch']} (CUDA {peers['cuda']}); "
      f"measured device copy {copy:.0f} GB/s (read + written)\n")
print("| case | M x N x K | timing | ours us | torch us | ratio | ours TFLOP/s | of peak | weight GB/s | of copy |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
worst = None
for r in ours["rows"]:
    if r["bench"] != "gemm":
        continue
    key = (r["name"], r["shape"], r["timing"])
    p = index.get(key)
    graph = r["timing"] == "graph"
    us = r["per_item_us"] if graph else r["median_us"]
    ptxt, ratio = "-", "-"
    if p and "error" not in p:
        pus = p["per_item_us"]
        ptxt = f"{pus:.1f}"
        q = pus / us
        ratio = f"{q:.2f}"
        if worst is None or q < worst[0]:
            worst = (q, key)
    elif p:
        ptxt = "n/a"
    kind = "bf16" if r["name"].startswith("bf16") else "fp8"
    frac = r["tflops"] / peak[kind]
    gb = f"{r['gbps']:.0f}" if graph else "-"
    of_copy = f"{r['gbps'] / copy:.2f}" if graph else "-"
    print(f"| {r['name']} | {r['shape']} | {r['timing']} | {us:.1f} | {ptxt} | {ratio} | "
          f"{r['tflops']:.0f} | {frac:.2f} | {gb} | {of_copy} |")
if worst:
    print(f"\nlowest ratio: {worst[0]:.3f} at {worst[1]}")
errs = [p for p in peers["rows"] if "error" in p]
for p in errs:
    print(f"- torch {p['name']} {p['shape']}: {p['error'][:160]}")
