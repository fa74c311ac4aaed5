#!/usr/bin/env python3
"""ncu_step_summary.py CSV KERNELS_PER_STEP [RUN_LOG] - the last decode step of an Nsight Compute
CSV (`ncu --metrics gpu__time_duration.sum --print-units base --csv`), kernel by kernel.

The last KERNELS_PER_STEP kernels of the profile are the last graph-replayed step. Prints, per
kernel name (template arguments cut), how many ran and their microseconds alone, sorted by
time, then their sum against the replayed step's ms from RUN_LOG (a `run --json` log)."""
import collections
import csv
import json
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    reader = csv.reader(lines)
    header = None
    for row in reader:
        if header is None:
            if "Kernel Name" in row and "Metric Value" in row:
                header = row
            continue
        rec = dict(zip(header, row))
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3}.get(
            rec.get("Metric Unit", "nsecond"), 1e-3)
        yield rec["Kernel Name"], float(rec["Metric Value"].replace(",", "")) * scale


def short(name):
    cut = name.find("(")
    name = name if cut < 0 else name[:cut]
    cut = name.find("<")
    return name if cut < 0 else name[:cut] + "<>"


def main():
    kernels = list(rows(sys.argv[1]))
    per_step = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    if not kernels or per_step <= 0 or per_step > len(kernels):
        print(f"{sys.argv[1]}: {len(kernels)} kernels profiled, {per_step} per step: no summary")
        return
    step = kernels[-per_step:]
    total = collections.defaultdict(float)
    count = collections.Counter()
    for name, us in step:
        total[short(name)] += us
        count[short(name)] += 1
    alone = sum(us for _, us in step)
    print(f"{sys.argv[1]}: last step, {per_step} kernels, each timed alone")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"  {total[name]:9.1f} us  {count[name]:4d} x {total[name] / count[name]:7.2f} us  {name}")
    replayed = None
    if len(sys.argv) > 3:
        text = open(sys.argv[3]).read()
        try:
            replayed = json.loads(text[text.find("{"):])["decode_ms_per_step"]
        except (ValueError, KeyError):
            pass
    line = f"  sum alone {alone / 1e3:.3f} ms"
    if replayed:
        line += f"; the replayed step {replayed:.3f} ms"
    print(line)


if __name__ == "__main__":
    main()
