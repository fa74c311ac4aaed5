#!/usr/bin/env python3
"""PyTorch figures for `metrale-gpu bench decode`, same shapes, measured the same way.

    python3 bench/peers/peers_decode.py --out peers_decode.json

Decode attention: one query per request over contiguous K/V ([B, Hkv, L, D], the keys gathered
out of any page table beforehand, so the time is attention only), Hq=32, Hkv=8, D=128, BF16,
batch {1, 8, 32, 128} x context {512, 2048, 8192, 32768}, cases of more than 2^20 cached tokens
skipped; SDPA (automatic backend, enable_gqa) under CUDA-graph replay, median of event-timed
replays, like our graph-timed rows. Reported as KV bytes read per second (2 * B * L * Hkv * D *
2 bytes per call), the metric of our rows.

Rows (keys as metrale's rows, for bench/peers/report.py):
  decode/b<B>_L<L>         SDPA; target 1.5x where SDPA is latency-bound (B <= 8 and
                           L <= 8192: split the keys across blocks), else 1.0x (paging must
                           cost nothing).
  decode/ragged_b<B>_L<L>  the same SDPA figure, for our ragged op on contiguous keys, 1.0x.
  decode/fp8_b<B>_L<L>     FP8 E4M3 K/V with per-head scales, as torch does it without an FP8
                           kernel: dequantize to BF16 (code * scale per head), then SDPA;
                           reported per FP8 byte read (2 * B * L * Hkv * D), target 1.0x.
  decode/append_<tokens>   a copy of the QKV rows' K and V with torch (index_copy_ into a flat
                           pool by slot), for the record; the target is 0.7 of copy bandwidth
                           (checked in the note of our row).
"""
import argparse
import json

import torch
import torch.nn.functional as F

from peers_copy_launch import event_median_us  # same timing as every peer script

HQ, HKV, D = 32, 8, 128
MAX_TOKENS = 1 << 20


def graph_median_us(fn, iters, warmup=3):
    """Median device time of a CUDA-graph replay of fn(), in microseconds."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return event_median_us(graph.replay, iters, warmup)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    dev = torch.device("cuda")
    bf = torch.bfloat16
    torch.manual_seed(0)
    rows = {}
    how = "SDPA (auto backend, enable_gqa) on contiguous [B,Hkv,L,D] keys, graph replay"
    for b in (1, 8, 32, 128):
        for length in (512, 2048, 8192, 32768):
            if b * length > MAX_TOKENS:
                continue
            q = torch.rand(b, HQ, 1, D, device=dev, dtype=bf) * 2 - 1
            k = torch.rand(b, HKV, length, D, device=dev, dtype=bf) * 2 - 1
            v = torch.rand_like(k) * 2 - 1
            kv_bytes = 2.0 * b * HKV * length * D * 2
            key = f"decode/b{b}_L{length}"
            try:
                us = graph_median_us(
                    lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.iters)
                gbps = kv_bytes / us / 1e3
                target = 1.5 if b <= 8 and length <= 8192 else 1.0
                rows[key] = {"metric": "gbps", "value": gbps, "target_ratio": target, "how": how}
                rows[f"decode/ragged_b{b}_L{length}"] = {"metric": "gbps", "value": gbps,
                                                         "target_ratio": 1.0, "how": how}
                print(key, f"{us:.1f} us", f"{gbps:.0f} GB/s", flush=True)
            except Exception as e:  # noqa: BLE001 - record why the peer is missing
                rows[key + ".sdpa_error"] = {"metric": "info", "value": None, "how": str(e)[:200]}
            fp8_key = f"decode/fp8_b{b}_L{length}"
            try:
                scale = (torch.rand(1, HKV, 1, 1, device=dev) + 0.5) / 100
                k8 = (k.float() / scale).to(torch.float8_e4m3fn)
                v8 = (v.float() / scale).to(torch.float8_e4m3fn)
                del k, v
                torch.cuda.empty_cache()

                def fp8_decode():
                    kd = (k8.to(bf) * scale.to(bf))
                    vd = (v8.to(bf) * scale.to(bf))
                    return F.scaled_dot_product_attention(q, kd, vd, enable_gqa=True)

                us = graph_median_us(fp8_decode, args.iters)
                gbps = (kv_bytes / 2) / us / 1e3
                rows[fp8_key] = {"metric": "gbps", "value": gbps, "target_ratio": 1.0,
                                 "how": "FP8 K/V dequantized to BF16 per head, then SDPA, graph "
                                        "replay (FP8 bytes read)"}
                print(fp8_key, f"{us:.1f} us", f"{gbps:.0f} GB/s", flush=True)
                del k8, v8
            except Exception as e:  # noqa: BLE001 - record why the peer is missing
                rows[fp8_key + ".error"] = {"metric": "info", "value": None, "how": str(e)[:200]}
            k = v = None
            del q, k, v
            torch.cuda.empty_cache()
    # Append: the K and V columns of QKV rows into a pool by slot (a plain scatter, no RoPE).
    for tokens in (128, 16384):
        row = (HQ + 2 * HKV) * D
        qkv = torch.rand(tokens, row, device=dev, dtype=bf)
        pool_k = torch.zeros(tokens, HKV * D, device=dev, dtype=bf)
        pool_v = torch.zeros_like(pool_k)
        slots = torch.randperm(tokens, device=dev)

        def scatter():
            pool_k.index_copy_(0, slots, qkv[:, HQ * D:(HQ + HKV) * D])
            pool_v.index_copy_(0, slots, qkv[:, (HQ + HKV) * D:])

        us = graph_median_us(scatter, args.iters)
        moved = 2.0 * tokens * 2 * HKV * D * 2  # K and V read and written
        rows[f"decode/append_{tokens}.torch_scatter"] = {
            "metric": "gbps", "value": moved / us / 1e3,
            "how": "index_copy_ of K and V into a pool by slot, no RoPE (bytes read + written)"}
        print(f"append {tokens}", f"{us:.1f} us", flush=True)
    props = torch.cuda.get_device_properties(0)
    json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
               "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
