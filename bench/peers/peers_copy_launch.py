#!/usr/bin/env python3
"""PyTorch figures for `metrale-gpu bench copy` and `bench launch`, measured the same way.

Run on the GPU machine in the same call as the metrale benchmarks:

    python3 bench/peers/peers_copy_launch.py --out peers_copy_launch.json

Each row is keyed "bench/case" like metrale's rows and says which metric to compare
("gbps": higher is better; "per_item_us": lower is better) and the target, so
bench/peers/report.py can print the side-by-side table without knowing the cases.
"""
import argparse
import json
import time

import torch

GiB = 1 << 30


def event_median_us(fn, iters, warmup):
    """Median device time of fn() between two CUDA events, in microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def host_median_us(fn, iters, warmup, sync_inside):
    """Median wall-clock time of fn(), with the stream synchronized inside or after."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if sync_inside:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        if not sync_inside:
            torch.cuda.synchronize()
        samples.append((t1 - t0) * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--d2d-mib", type=int, default=4096)
    parser.add_argument("--host-mib", type=int, default=1024)
    parser.add_argument("--launches", type=int, default=2000)
    args = parser.parse_args()

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    rows = {}

    def bandwidth(key, us, nbytes, target, how):
        rows[key] = {"metric": "gbps", "value": nbytes / (us * 1e3), "median_us": us,
                     "target_ratio": target, "how": how}
        print(f"{key:28s} {nbytes / (us * 1e3):10.1f} GB/s  ({how})", flush=True)

    # device to device: bytes read + written
    n = args.d2d_mib << 20
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    a.random_()
    bandwidth("copy/d2d", event_median_us(lambda: b.copy_(a), 20, 3), 2 * n, 0.98,
              "b.copy_(a), events")
    del a, b

    n = args.host_mib << 20
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    d.random_()
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    pinned.random_()
    pageable.random_()  # touches every page
    bandwidth("copy/h2d_pinned", event_median_us(lambda: d.copy_(pinned, non_blocking=True), 10, 3),
              n, 0.98, "d.copy_(pinned, non_blocking=True), events")
    bandwidth("copy/d2h_pinned", event_median_us(lambda: pinned.copy_(d, non_blocking=True), 10, 3),
              n, 0.98, "pinned.copy_(d, non_blocking=True), events")
    bandwidth("copy/h2d_pageable", host_median_us(lambda: d.copy_(pageable), 10, 3, True), n, 3.0,
              "d.copy_(pageable), wall clock with sync")
    bandwidth("copy/d2h_pageable", host_median_us(lambda: pageable.copy_(d), 10, 3, True), n, None,
              "pageable.copy_(d), wall clock with sync")
    rows["copy/h2d_pageable_events"] = {
        "metric": "info", "value": n / (event_median_us(lambda: d.copy_(pageable), 10, 3) * 1e3),
        "how": "d.copy_(pageable), events around one copy"}
    print(f"{'copy/h2d_pageable_events':28s} {rows['copy/h2d_pageable_events']['value']:10.1f} GB/s",
          flush=True)

    # 256 small pageable uploads: host time to issue each
    small = torch.empty(4096, dtype=torch.uint8)
    small.random_()
    views = [d[i * 4096:(i + 1) * 4096] for i in range(256)]

    def uploads():
        for v in views:
            v.copy_(small, non_blocking=True)
    us = host_median_us(uploads, 20, 3, False)
    rows["copy/h2d_pageable_4k"] = {"metric": "per_item_us", "value": us / 256, "median_us": us,
                                    "target_ratio": None,
                                    "how": "256 x view.copy_(4 KiB pageable, non_blocking=True)"}
    print(f"{'copy/h2d_pageable_4k':28s} {us / 256:10.3f} us/copy", flush=True)
    del d, pinned, pageable

    # launches: x.add_(1.0) on one element, PyTorch's cheapest eager kernel
    x = torch.zeros(1, device=dev)
    count = args.launches

    def burst():
        for _ in range(count):
            x.add_(1.0)
    us = host_median_us(burst, 20, 2, False)
    rows["launch/eager_host"] = {"metric": "per_item_us", "value": us / count, "median_us": us,
                                 "target_max": 4.0, "how": "x.add_(1.0), host time to issue"}
    us = event_median_us(burst, 20, 2)
    rows["launch/eager_events"] = {"metric": "per_item_us", "value": us / count, "median_us": us,
                                   "how": "x.add_(1.0), events around the burst"}
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        burst()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            burst()
    us = event_median_us(lambda: graph.replay(), 20, 2)
    rows["launch/graph_replay"] = {"metric": "per_item_us", "value": us / count, "median_us": us,
                                   "target_max": 1.2, "how": "graph of the burst, replayed, events"}
    for key in ("launch/eager_host", "launch/eager_events", "launch/graph_replay"):
        print(f"{key:28s} {rows[key]['value']:10.3f} us/launch", flush=True)

    result = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
