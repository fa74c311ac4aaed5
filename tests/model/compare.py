"""Teacher-forced comparison of `metrale-gpu run --model` with the reference of make_reference.py.

Usage: compare.py METRALE_GPU MODEL REF_DIR [--backend B] [--cases N] [--top K]
                  [--rel-bound R] [--abs-bound A]

For every case: runs metrale-gpu on the prompt, fed the reference's continuation
(--teacher-force), with each step's K largest logits (--top-logits K), and checks, per step:
  - every one of our K logits is within BOUND of the reference's logit of the same token, where
    BOUND = ABS_BOUND + REL_BOUND * (the reference's largest |logit| of that step);
  - our greedy token equals the reference's wherever the reference's top-1/top-2 margin exceeds
    BOUND (a smaller margin is a near-tie that rounding may flip).
The bounds come from the arithmetic being compared: the reference is float32 throughout with the
weights decoded exactly by the gguf package; the runtime keeps every activation in BF16 (8
significant bits, relative rounding 2^-9 per value) through 30 layers, its embedding table and
LM head in BF16 (the file's Q8_0 embedding rounded once, relative 2^-9), so the logits carry a
few BF16 roundings amplified through the layers. Measured on the CPU backend on 2026-12-01 over
the four cases (52 steps): largest error 0.020 of the step's largest |logit| (0.50 absolute, on
logits up to about 25), greedy tokens equal on every step. REL_BOUND is twice the relative
figure; ABS_BOUND covers steps whose logits are all small. Prints the largest errors seen and
exits 1 on any failure.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ABS_BOUND = 0.1
REL_BOUND = 0.04


def read_case(ref, c):
    meta = dict(line.split(" ", 1) for line in (ref / f"case{c}.txt").read_text().splitlines())
    prompt = meta["prompt"].strip()
    cont = meta["continuation"].strip()
    rows, vocab = int(meta["rows"]), int(meta["vocab"])
    logits = np.fromfile(ref / f"case{c}.f32", dtype="<f4").reshape(rows, vocab)
    return prompt, cont, logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("gguf")
    ap.add_argument("ref", type=Path)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--cases", type=int, default=0)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--rel-bound", type=float, default=REL_BOUND)
    ap.add_argument("--abs-bound", type=float, default=ABS_BOUND)
    a = ap.parse_args()
    cases = int((a.ref / "cases").read_text())
    if a.cases:
        cases = min(cases, a.cases)
    failures, worst, steps_checked, top1_checked = 0, 0.0, 0, 0
    agree, abs_worst = 0, 0.0
    for c in range(cases):
        prompt, cont, ref = read_case(a.ref, c)
        cmd = [a.cli, "--backend", a.backend, "--json", "run", "--model", a.gguf,
               "--prompt-ids", prompt, "--teacher-force", cont, "--top-logits", str(a.top)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            print(f"case {c}: metrale-gpu failed ({p.returncode}): {p.stderr.strip()}")
            failures += 1
            continue
        out = json.loads(p.stdout)
        if out["prompt_ids"] != [int(x) for x in prompt.split(",")]:
            print(f"case {c}: prompt ids differ")
            failures += 1
        steps = out["steps"]
        if len(steps) != ref.shape[0]:
            print(f"case {c}: {len(steps)} steps, the reference has {ref.shape[0]} rows")
            failures += 1
            continue
        case_worst = 0.0
        for i, step in enumerate(steps):
            row = ref[i]
            scale = float(np.max(np.abs(row)))
            bound = a.abs_bound + a.rel_bound * scale
            for tid, value in step["top"]:
                err = abs(value - float(row[tid]))
                case_worst = max(case_worst, err / scale)
                if err > bound:
                    print(f"case {c} step {i}: token {tid} logit {value:.4f}, reference "
                          f"{row[tid]:.4f} (bound {bound:.4f})")
                    failures += 1
            order = np.argsort(-row, kind="stable")
            margin = float(row[order[0]] - row[order[1]])
            steps_checked += 1
            if margin > bound:
                top1_checked += 1
                if step["id"] != int(order[0]):
                    print(f"case {c} step {i}: greedy token {step['id']}, reference "
                          f"{int(order[0])} with margin {margin:.4f}")
                    failures += 1
            agree += step["id"] == int(order[0])
            abs_worst = max(abs_worst, max(abs(v - float(row[t])) for t, v in step["top"]))
        worst = max(worst, case_worst)
        print(f"case {c}: {len(steps)} steps, largest error {case_worst:.4f} of the step's "
              f"largest |logit|")
    print(f"{steps_checked} steps compared ({top1_checked} with a top-1 margin above the bound), "
          f"largest relative logit error {worst:.4f} (bound {a.rel_bound} + {a.abs_bound} "
          f"absolute); "
          f"{failures} failures; greedy tokens equal on {agree} of {steps_checked} steps; "
          f"largest absolute logit error {abs_worst:.4f}")
    print(f"{steps_checked - failures if failures < steps_checked else 0} passed, "
          f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
