"""Teacher-forced logits of the same cases from Hugging Face transformers (the GPU machine's
independent implementation), in the layout compare.py reads.

Usage: transformers_reference.py GGUF CASES_DIR OUT_DIR [--dtype bfloat16|float32]

Converts GGUF to a Hugging Face directory exactly as make_reference.py does (the gguf package's
decoders, llama.cpp's Q/K permutation undone), loads it with transformers' LlamaForCausalLM on
the GPU in the given dtype, and for every case of CASES_DIR (prompt and continuation ids, as
make_reference.py wrote them) writes the logits of the positions from the last prompt token on.
"""
import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from make_reference import convert  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("cases", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    hf = a.out / "hf"
    if not (hf / "model.safetensors").exists():
        convert(a.gguf, hf)
    from transformers import AutoModelForCausalLM
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=dtype).cuda().eval()
    n = int((a.cases / "cases").read_text())
    for c in range(n):
        meta = dict(l.split(" ", 1) for l in (a.cases / f"case{c}.txt").read_text().splitlines())
        prompt = [int(x) for x in meta["prompt"].split(",")]
        cont = [int(x) for x in meta["continuation"].split(",")]
        with torch.no_grad():
            ids = torch.tensor([prompt + cont], device="cuda")
            logits = model(ids).logits[0].float().cpu().numpy()
        rows = logits[len(prompt) - 1:]
        (a.out / f"case{c}.txt").write_text(
            f"prompt {meta['prompt']}\ncontinuation {meta['continuation']}\n"
            f"rows {rows.shape[0]}\nvocab {rows.shape[1]}\n")
        rows.astype("<f4").tofile(a.out / f"case{c}.f32")
    (a.out / "cases").write_text(str(n))
    print(f"transformers {a.dtype}: {n} cases in {a.out}")


if __name__ == "__main__":
    main()
