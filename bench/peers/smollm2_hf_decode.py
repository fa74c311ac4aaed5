#!/usr/bin/env python3
"""The peer a user of SmolLM2-135M-Instruct on a GPU would pick: transformers, the GGUF checkpoint
dequantized by transformers' own GGUF loader (the gguf package) to BF16, greedy decoding with a
static KV cache, eager and with the forward compiled (transformers' generate compiles it itself
when the cache is static; mode "reduce-overhead", i.e. CUDA graphs).

    python3 bench/peers/smollm2_hf_decode.py MODEL.gguf OUT.json [PROMPT_TOKENS] [STEPS]

A decode step's time is the difference of two generate calls (STEPS + 16 and 16 new tokens, the
same prompt, min_new_tokens forcing the count) over STEPS: prefill and start-up cancel out, as
`metrale-gpu run --model --json`'s decode_ms_per_step excludes the prefill. Prints and writes
{"hf_eager_static": ms, "hf_compiled_static": ms, ...}; a variant that fails records its error.
"""
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM

path, out = sys.argv[1], sys.argv[2]
prompt_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 256
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".",
                                             gguf_file=os.path.basename(path),
                                             dtype=torch.bfloat16).cuda().eval()
torch.manual_seed(0)
prompt = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), device="cuda")


def generate_seconds(new_tokens, **kw):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, cache_implementation="static", **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


result = {"torch": torch.__version__, "prompt_tokens": prompt_tokens, "steps": steps,
          "gpu": torch.cuda.get_device_name()}
for name, kw in (("hf_eager_static", {"disable_compile": True}), ("hf_compiled_static", {})):
    try:
        for _ in range(2):  # warm-up: compilation, graph capture, allocator
            generate_seconds(steps + 16, **kw)
        best = min(generate_seconds(steps + 16, **kw) - generate_seconds(16, **kw) for _ in range(3))
        result[name] = best * 1e3 / steps
    except Exception as e:  # noqa: BLE001 - a peer variant that fails is recorded, not fatal
        result[name + "_error"] = f"{type(e).__name__}: {e}"[:400]
    print(name, result.get(name), result.get(name + "_error", ""), flush=True)
json.dump(result, open(out, "w"), indent=1)
