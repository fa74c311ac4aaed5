#!/usr/bin/env python3
"""PyTorch figures for `metrale-gpu bench attention`, same shapes, measured the same way.

    python3 bench/peers/peers_attention.py --out peers_attention.json

Hq=32, Hkv=8, D=128, BF16, causal (bottom-right aligned) and full; B x S in {1x8192, 4x4096,
8x2048, 32x512}, a ragged mix of 16 requests with lengths 1..4096 (the generator of
tools/metrale-gpu/bench_attention.c) and a prefix case (4 x 1024 queries over 4096 keys).

Rows (keys as metrale's rows, for bench/peers/report.py):
  attention/<case>      cuDNN through SDPA (fixed shapes; K/V heads repeated to Hq, as SDPA
                        needs) with target 1.0x; for the ragged and prefix cases, which SDPA
                        cannot run packed, FlashAttention-2 varlen with target 1.8x.
  attention/<case>.fa2  FlashAttention-2 varlen through PyTorch (native GQA, packed rows), the
                        peer of our FA2 path, target 1.0x.
  attention/<case>.sdpa_flash / .cudnn / .flash_varlen  every figure, for the record.
FLOPs counted per request: 4*D*Hq*(Lq*Lk - Lq*(Lq-1)/2) causal, 4*D*Hq*Lq*Lk full.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peers_copy_launch import event_median_us  # same timing as every peer script

HQ, HKV, D = 32, 8, 128


def ragged_lengths(count, max_len):
    x, out = 2026, []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(1 + (x >> 33) % max_len)
    return out


def flops(qo, kv, causal):
    pairs = sum(q * k - (q * (q - 1) // 2 if causal else 0) for q, k in zip(qo, kv))
    return 4.0 * D * HQ * pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = {}

    cases = [(f"{b}x{s}", [s] * b, [s] * b, True) for b, s in
             [(1, 8192), (4, 4096), (8, 2048), (32, 512)]]
    lens = ragged_lengths(16, 4096)
    cases.append(("ragged16", lens, lens, False))
    cases.append(("prefix4", [1024] * 4, [4096] * 4, False))

    for name, qo, kv, fixed in cases:
        for causal in (True, False):
            key = f"attention/{'causal' if causal else 'full'}_{name}"
            fl = flops(qo, kv, causal)
            figures = {}
            q = torch.rand(sum(qo), HQ, D, device=dev, dtype=torch.bfloat16) * 2 - 1
            k = torch.rand(sum(kv), HKV, D, device=dev, dtype=torch.bfloat16) * 2 - 1
            v = torch.rand_like(k) * 2 - 1
            cu_q = torch.tensor([0] + list(torch.tensor(qo).cumsum(0)), device=dev, dtype=torch.int32)
            cu_k = torch.tensor([0] + list(torch.tensor(kv).cumsum(0)), device=dev, dtype=torch.int32)
            try:  # FA2 varlen: bottom-right causal, native GQA
                fn = lambda: torch.ops.aten._flash_attention_forward(
                    q, k, v, cu_q, cu_k, max(qo), max(kv), 0.0, causal, False, scale=D ** -0.5)
                figures["flash_varlen"] = fl / event_median_us(fn, args.iters, 3) / 1e6
            except Exception as e:  # noqa: BLE001 - record why a backend is missing
                figures["flash_varlen_error"] = str(e)[:200]
            if fixed:
                b, s = len(qo), qo[0]
                q4 = q.view(b, s, HQ, D).transpose(1, 2)
                k4 = k.view(b, s, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1)
                v4 = v.view(b, s, HKV, D).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1)
                for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel([backend]):
                            fn = lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)
                            figures[label] = fl / event_median_us(fn, args.iters, 3) / 1e6
                    except Exception as e:  # noqa: BLE001
                        figures[label + "_error"] = str(e)[:200]
            print(key, {k_: round(v_, 1) if isinstance(v_, float) else v_ for k_, v_ in figures.items()},
                  flush=True)
            how_fa2 = "FlashAttention-2 varlen (torch.ops.aten._flash_attention_forward), packed, GQA native"
            if fixed and "cudnn" in figures:
                rows[key] = {"metric": "tflops", "value": figures["cudnn"], "target_ratio": 1.0,
                             "how": "SDPA cuDNN backend, [B,H,S,D], K/V repeated to Hq"}
            elif "flash_varlen" in figures:
                rows[key] = {"metric": "tflops", "value": figures["flash_varlen"],
                             "target_ratio": 1.8, "how": how_fa2}
            if "flash_varlen" in figures:
                rows[key + ".fa2"] = {"metric": "tflops", "value": figures["flash_varlen"],
                                      "target_ratio": 1.0, "how": how_fa2}
            for label, value in figures.items():
                rows[f"{key}.{label}"] = ({"metric": "tflops", "value": value, "how": label}
                                          if isinstance(value, float) else
                                          {"metric": "info", "value": None, "how": value})
            del q, k, v
            torch.cuda.empty_cache()

    props = torch.cuda.get_device_properties(0)
    json.dump({"torch": torch.__version__, "cuda": torch.version.cuda,
               "cudnn": torch.backends.cudnn.version(), "device": props.name, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
