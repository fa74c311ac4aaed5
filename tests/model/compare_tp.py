"""Teacher-forced comparison of a tensor-parallel `metrale-gpu run --model` with the one-device
run of the same checkpoint on the same backend (ctest smollm2_tp_cpu).

Usage: compare_tp.py METRALE_GPU MODEL [--backend B] [--tp N ...] [--top K] [--steps S]
(SmolLM2's 3 KV heads split over 3 ranks; 2 would be refused.)

For each prompt: the one-device run's greedy continuation (S steps) is fed back to both runs
(--teacher-force), each printing every step's K largest logits (--top-logits K); per step:
  - every logit of the split run's top K whose token is in the one-device run's top K as well is
    within BOUND (absolute) of the one-device run's;
  - every token of the one-device run's top K scoring above its K-th logit + 2 BOUND is in the
    split run's top K (so a token that the split run lost, or pushed out, cannot hide by being
    in only one list). 2 BOUND, not BOUND: a token u outside the one-device top K (at most the
    K-th logit there) can outscore such a token t in the split run only if both moved by more
    than BOUND, so with every logit within BOUND t is always there;
  - the split run's greedy token is the one-device run's wherever the one-device top-1/top-2
    margin exceeds BOUND (a smaller margin may flip legitimately).
The bound: the split runs the same BF16 arithmetic except that each row-parallel product (the
output and down projections, 30 layers) is the BF16 sum of N BF16-rounded partial products
instead of one rounding of the whole dot product; those extra roundings (relative 2^-9 each)
travel through the residual stream like the runtime's own, so the logits differ by a few BF16
roundings amplified through the layers: an absolute difference of the same size whatever the
step's logits (it is also the size of the runtime's difference from a float32 reference,
tests/model/compare.py: 0.50). Measured on the CPU backend (2026-12-06, SmolLM2-135M Q4_1,
tp 3, both prompts, 48 steps): largest difference 0.43, on steps whose largest logit is 4 to 34;
BOUND is about twice that. Standard library only; exits 1 on any failure.
"""
import argparse
import json
import subprocess
import sys

BOUND = 0.8
PROMPTS = ["1,504,3145,282,4049,30,2436,17,6463,314,1167,281,1015,28",
           "1,9690,2114,253,5442,282,1789,281,253,1345,28,378"]


def run(cli, model, backend, tp, prompt, extra):
    cmd = [cli, "--backend", backend, "--json", "run", "--model", model, "--prompt-ids", prompt,
           "--tp", str(tp)] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.stderr.write(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr}")
        sys.exit(1)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("model")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--tp", type=int, nargs="+", default=[3])
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--steps", type=int, default=24)
    a = ap.parse_args()
    failures = 0
    for prompt in PROMPTS:
        greedy = run(a.cli, a.model, a.backend, 1, prompt, ["--steps", str(a.steps)])
        cont = ",".join(str(t) for t in greedy["generated_ids"][:a.steps])
        forced = ["--teacher-force", cont, "--top-logits", str(a.top)]
        one = run(a.cli, a.model, a.backend, 1, prompt, forced)["steps"]
        for tp in a.tp:
            split = run(a.cli, a.model, a.backend, tp, prompt, forced)["steps"]
            worst, worst_rel, checked, checked_in = 0.0, 0.0, 0, 0
            for s, (x, y) in enumerate(zip(one, split)):
                ref, got = dict(map(tuple, x["top"])), dict(map(tuple, y["top"]))
                scale = max(abs(v) for v in ref.values())
                bound = BOUND
                for t in ref.keys() & got.keys():
                    err = abs(ref[t] - got[t])
                    worst, worst_rel = max(worst, err), max(worst_rel, err / scale)
                    checked += 1
                    if err > bound:
                        failures += 1
                        print(f"FAIL tp {tp} step {s} token {t}: {got[t]:.4f} vs {ref[t]:.4f} "
                              f"(bound {bound:.4f})")
                top = sorted(ref.values(), reverse=True)
                kth = top[-1]  # the one-device run's K-th logit
                for t in sorted(ref.keys() - got.keys()):
                    checked_in += 1
                    if ref[t] > kth + 2 * bound:
                        failures += 1
                        print(f"FAIL tp {tp} step {s} token {t}: {ref[t]:.4f} in the one-device "
                              f"top {len(ref)} (K-th {kth:.4f} + 2 x {bound:.4f} below it) but "
                              f"not in the split run's")
                if x["id"] != y["id"] and top[0] - top[1] > bound:
                    failures += 1
                    print(f"FAIL tp {tp} step {s}: greedy {y['id']} vs {x['id']}, margin "
                          f"{top[0] - top[1]:.4f} above the bound {bound:.4f}")
            if len(split) != len(one) or checked == 0:
                failures += 1
                print(f"FAIL tp {tp}: {len(split)} steps, {len(one)} expected, {checked} logits")
            print(f"prompt {prompt[:24]}...: tp {tp} vs 1 over {len(one)} steps: largest logit "
                  f"difference {worst:.4f} ({worst_rel:.4f} of the step's largest |logit|; bound "
                  f"{BOUND}), {checked} logits compared, {checked_in} tokens in one top K only")
    sys.exit(1 if failures else 0)


main()
