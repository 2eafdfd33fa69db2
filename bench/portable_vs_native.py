#!/usr/bin/env python3
"""The default build (x86-64-v2 baseline, run-time kernel dispatch) against --config=native
(-march=native), same run.

Usage: bench/portable_vs_native.sh [--rounds=N] [--iters=N]   (builds both, then runs this)

Both dbrq_bench servers run the same model, mode, batch and thread count; their timing chunks
alternate (portable, native, native, portable, ...) so that load on a busy machine hits both alike.
Prints one row per case, the median time of each build and the ratio portable / native (goal:
within 3%, i.e. <= 1.03), and a last line with every ratio as JSON.

--control adds a second server of the portable build, timed in the same rotation: the column
"A/A" is portable / portable (same binary, another process), the noise floor of this machine at
this moment. A portable/native ratio inside the A/A spread is not a measured difference.
"""
import argparse
import json
import statistics
import sys

from dbrq_server import DbrqServer


CASES = [
    ("resnet18", "int8", 1), ("resnet18", "fp32", 1), ("mobilenet_v2", "int8", 1),
    ("bert_encoder", "int8", 1), ("small_cnn", "int8", 8), ("gru_classifier", "dynamic", 8),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--portable", required=True)
    ap.add_argument("--native", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--control", action="store_true",
                    help="also time a second portable process: the A/A noise floor")
    args = ap.parse_args()
    sides = {"portable": DbrqServer(args.portable), "native": DbrqServer(args.native)}
    if args.control:
        sides["control"] = DbrqServer(args.portable)
    ratios = {}
    controls = {}
    print(f"{'case':34s} {'portable':>11s} {'native':>11s} {'ratio':>7s}"
          + (f" {'A/A':>7s}" if args.control else ""))
    try:
        for model, mode, batch in CASES:
            setup = dict(cmd="setup", model=model, mode=mode, batch=batch, threads=args.threads)
            for s in sides.values():
                s.call(**setup)
                s.call(cmd="time", iters=2, warmup=1)
            samples = {k: [] for k in sides}
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
                for k in order:
                    sides[k].call(**setup)
                    samples[k] += sides[k].call(cmd="time", iters=args.iters, warmup=0)["samples_ms"]
            med = {k: statistics.median(v) for k, v in samples.items()}
            name = f"{model}_{mode}_bs{batch}_t{args.threads}"
            ratios[name] = med["portable"] / med["native"]
            row = f"{name:34s} {med['portable']:9.3f}ms {med['native']:9.3f}ms {ratios[name]:7.3f}"
            if args.control:
                controls[name] = med["portable"] / med["control"]
                row += f" {controls[name]:7.3f}"
            print(row, flush=True)
    finally:
        for s in sides.values():
            s.close()
    worst = max(ratios.values())
    print(f"worst ratio portable/native {worst:.3f} (goal <= 1.03: {'met' if worst <= 1.03 else 'missed'})")
    if args.control:
        spread = max(abs(c - 1) for c in controls.values())
        print(f"A/A noise floor: portable/portable within {spread:.3f} of 1 (a ratio closer to 1 than "
              f"1 + {spread:.3f} is not a measured difference)")
    print(json.dumps({"portable/native": ratios, "A/A": controls} if args.control else ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
