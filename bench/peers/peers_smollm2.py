"""The peer of `metrale-gpu run --model` on the GPU: SmolLM2-135M-Instruct through Hugging Face
transformers, greedy decode at batch 1, eager and with a static KV cache (which generate()
compiles with torch.compile itself, transformers' own recommended fast path; compiling
model.forward by hand on top of it fails in transformers 5.17 with "accessing tensor output of
CUDAGraphs that has been overwritten"), on the BF16 directory tests/model/ converts the GGUF to.

Usage: peers_smollm2.py HF_DIR PROMPT_IDS [--new 128] [--json-out FILE]
Decode time per token = (time of generate(new + 1 tokens) - time of generate(1 token)) / new,
each the median of 5 runs after warm-up, min_new_tokens forcing the full length.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn, reps=5):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def measure(model, ids, new, **kw):
    def gen(n):
        return lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      **kw)
    for _ in range(3):
        gen(new + 1)()
    t1 = timed(gen(1))
    tn = timed(gen(new + 1))
    return {"first_token_ms": t1 * 1e3, "decode_ms_per_token": (tn - t1) * 1e3 / new}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("prompt_ids")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    ids = torch.tensor([[int(x) for x in a.prompt_ids.split(",")]], device="cuda")
    model = AutoModelForCausalLM.from_pretrained(a.hf, dtype=torch.bfloat16).cuda().eval()
    model.generation_config.pad_token_id = 2
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "prompt_tokens": ids.shape[1], "new_tokens": a.new}
    with torch.no_grad():
        for k, kw in (("eager", {}), ("static_compile", {"cache_implementation": "static"})):
            try:
                r = out[k] = measure(model, ids, a.new, **kw)
            except Exception as e:  # a peer that cannot run is reported, not hidden
                out[k] = {"error": str(e)[:400]}
                print(f"transformers {k}: failed: {str(e)[:400]}")
                continue
            print(f"transformers {k}: decode {r['decode_ms_per_token']:.3f} ms/token "
                  f"({1e3 / r['decode_ms_per_token']:.1f} tokens/s), first token "
                  f"{r['first_token_ms']:.2f} ms", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
