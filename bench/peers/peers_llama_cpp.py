"""llama.cpp (llama-cpp-python) on the CPU: prompt processing and greedy decode speed of a GGUF
file, for bench/cpu_llama_cpp.sh.

Usage: peers_llama_cpp.py GGUF PROMPT_IDS [--new 64] [--json-out FILE]
Prefill tokens/s = prompt tokens / time of evaluating the prompt; decode tokens/s = new tokens
/ time of generating them one at a time (greedy), each the median of 3 runs after a warm-up,
with all the machine's cores (llama.cpp's default thread count).
"""
import argparse
import json
import os
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("prompt_ids")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    ids = [int(x) for x in a.prompt_ids.split(",")]
    threads = os.cpu_count()
    llm = Llama(model_path=a.gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    pre, dec = [], []
    for rep in range(4):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        for _ in range(a.new):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        t2 = time.perf_counter()
        if rep:
            pre.append(t1 - t0)
            dec.append(t2 - t1)
    pre.sort()
    dec.sort()
    out = {"threads": threads, "prompt_tokens": len(ids), "new_tokens": a.new,
           "prefill_tokens_per_s": len(ids) / pre[1], "decode_tokens_per_s": a.new / dec[1]}
    print(json.dumps(out))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
