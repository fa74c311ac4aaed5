#!/usr/bin/env python3
"""Side-by-side table of metrale benchmark rows and their PyTorch peers, as markdown.

    python3 bench/peers/report.py --metrale metrale_*.json --peers peers_*.json \
        --command "bash bench/gpu_run.sh" --out results.md

metrale files come from `metrale-gpu bench ... --json-out`; peer files map "bench/case" to
{"metric", "value", optional "target_ratio" (ours vs torch, higher is better) and
"target_max" (an absolute bound on our value)}. The ratio is always "x torch, higher is
better": ours / torch for rates (gbps, tflops), torch / ours for times (per_item_us,
median_us). Rows without a peer are listed with their own figures.
"""
import argparse
import json
import sys

LOWER_IS_BETTER = {"per_item_us", "median_us"}


def fmt(value, metric):
    if value is None:
        return "-"
    if metric in LOWER_IS_BETTER:
        return f"{value:.3f} us"
    if metric == "gbps":
        return f"{value:.1f} GB/s"
    if metric == "tflops":
        return f"{value:.1f} TFLOP/s"
    return f"{value:.3g}"


def load_json_files(paths):
    """Yields (path, parsed JSON) for each readable file; says which it skips and why."""
    for path in paths:
        try:
            with open(path) as f:
                yield path, json.load(f)
        except (OSError, ValueError) as e:
            print(f"report: skipping {path}: {e}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrale", nargs="+", required=True)
    parser.add_argument("--peers", nargs="*", default=[])
    parser.add_argument("--command", default="")
    parser.add_argument("--title", default="metrale-gpu benchmarks against PyTorch")
    parser.add_argument("--notes", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    ours, meta = {}, {}
    for path, data in load_json_files(args.metrale):
        meta = meta or data
        for row in data.get("rows", []):
            ours.setdefault(f"{row['bench']}/{row['name']}", row)
    peers, peer_meta = {}, {}
    for path, data in load_json_files(args.peers):
        peer_meta = peer_meta or data
        rows = data.get("rows", {})
        if isinstance(rows, list):  # peers_gemm.py: its own table, compare_gemm.py
            print(f"report: {path} has per-shape rows; compare_gemm.py reports them", file=sys.stderr)
            continue
        peers.update(rows)

    lines = [f"# {args.title}", ""]
    lines.append(f"- date: {meta.get('date', '?')}")
    lines.append(f"- GPU: {meta.get('device', '?')} ({meta.get('multiprocessors', '?')} SMs, "
                 f"compute capability {meta.get('compute_capability', '?')})")
    lines.append(f"- driver: {meta.get('driver', '?')}")
    if peer_meta:
        lines.append(f"- PyTorch: {peer_meta.get('torch', '?')} (CUDA {peer_meta.get('cuda', '?')}), "
                     "measured in the same call")
    lines.append(f"- command: `{args.command}`" if args.command else "- command: ?")
    if args.notes:
        lines.append(f"- notes: {args.notes}")
    lines += ["", "| case | shape | metrale | PyTorch | x torch | target | met |",
              "|---|---|---|---|---|---|---|"]
    missed = 0
    for key, row in ours.items():
        peer = peers.get(key)
        metric = peer["metric"] if peer and peer.get("metric") != "info" else (
            "gbps" if row.get("gbps") else "per_item_us" if row.get("per_item_us") else "median_us")
        value = row.get(metric)
        torch_value = peer.get("value") if peer and peer.get("metric") != "info" else None
        ratio = None
        if value and torch_value:
            ratio = torch_value / value if metric in LOWER_IS_BETTER else value / torch_value
        target, met = [], []
        if peer and peer.get("target_ratio") is not None and ratio is not None:
            target.append(f">= {peer['target_ratio']}x")
            met.append(ratio >= peer["target_ratio"])
        if peer and peer.get("target_max") is not None and value is not None:
            target.append(f"<= {peer['target_max']} us")
            met.append(value <= peer["target_max"])
        verdict = "-" if not met else ("yes" if all(met) else "**no**")
        missed += bool(met) and not all(met)
        lines.append(f"| {key} | {row.get('shape', '')} | {fmt(value, metric)} | "
                     f"{fmt(torch_value, metric)} | {f'{ratio:.2f}' if ratio else '-'} | "
                     f"{', '.join(target) or '-'} | {verdict} |")
    extra = [k for k in peers if k not in ours]
    if extra:
        lines += ["", "PyTorch rows without a metrale row:", ""]
        for key in extra:
            p = peers[key]
            lines.append(f"- {key}: {fmt(p.get('value'), p.get('metric'))} ({p.get('how', '')})")
    lines += ["", "How each figure was taken:", ""]
    for key, row in ours.items():
        how = peers.get(key, {}).get("how", "")
        lines.append(f"- {key}: metrale {row.get('timing', '')} timing, median of "
                     f"{row.get('samples', '?')}; {row.get('note', '')}"
                     + (f"; PyTorch: {how}" if how else ""))
    lines.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"report: {missed} target(s) missed", file=sys.stderr)


if __name__ == "__main__":
    main()
