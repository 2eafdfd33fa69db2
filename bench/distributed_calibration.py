#!/usr/bin/python3
"""Distributed calibration throughput (issue 15): dbrq on 1, 2 and 4 MPI ranks, with the
reduction's cost (bytes, ms) reported separately, next to PyTorch 1.13 FX calibration of the same
model on the same images in the same run.

    bazel build -c opt //tools/cli:dbrq_mpi
    /usr/bin/python3 bench/distributed_calibration.py [--images 64] [--batch 8] [--ranks 1,2,4]

Each dbrq run is `mpirun --oversubscribe -np N dbrq_mpi quantize --model=resnet18 --distributed
--threads=max(1, cores/N)` on one calibration file (rank r takes batches r, r+n, ...); the numbers
come from rank 0's report: its calibration time plus the vote (which waits for the slowest rank),
and the reduction (serialize, gather, merge, broadcast, load). More ranks than cores share them
(this machine has 2 vCPUs: 4 ranks oversubscribe), so the 4-rank row measures the reduction's
overhead, not a speedup. Weights: random (dbrq --seed, torch.manual_seed); activation observer:
histogram in both (PyTorch's onednn default).
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def write_safetensors(path, name, array):
    """A one-tensor safetensors file (the format is an 8-byte header length, JSON, raw data)."""
    data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
    header = json.dumps({name: {"dtype": "F32", "shape": list(array.shape), "data_offsets": [0, len(data)]}})
    header += " " * ((8 - len(header) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header.encode())
        f.write(data)


def run_dbrq(binary, ranks, calib, batch, threads, out):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), binary, "quantize",
           "--model=resnet18", f"--calib={calib}", f"--batch_size={batch}", "--observer=histogram",
           f"--threads={threads}", "--progress=never", f"--out={out}", "--distributed"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"dbrq_mpi failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    m = re.search(r"timing: (\{.*\})", p.stdout)
    if not m:
        sys.exit(f"no timing line in dbrq_mpi's output:\n{p.stdout}")
    t = json.loads(m.group(1))
    t["wall_s"] = wall
    return t


def run_torch(images, batch, threads):
    import torch
    import torch_models as tm

    torch.set_num_threads(threads)
    model = tm.make_model("resnet18", 0).eval()
    x = torch.from_numpy(images)
    calib = [x[i:i + batch] for i in range(0, x.shape[0], batch)]
    timings = {}
    tm.fx_int8(model, calib[0], calib, timings=timings)
    return timings["calibrate_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bazel-bin/tools/cli/dbrq_mpi"))
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration (the faster is kept)")
    args = ap.parse_args()
    cores = os.cpu_count()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.images, 3, 224, 224), dtype=np.float32)
    tmp = tempfile.mkdtemp(prefix="dbrq_dist_bench_")
    calib = os.path.join(tmp, "calib.safetensors")
    write_safetensors(calib, "images", images)
    load = os.getloadavg()[0]
    print(f"ResNet-18 (224x224, random weights), {args.images} images in batches of {args.batch}, histogram "
          f"observers; {cores} cores; load average {load:.1f} at start")
    torch_s = min(run_torch(images, args.batch, cores) for _ in range(args.reps))
    torch_ips = args.images / torch_s
    print(f"PyTorch 1.13 FX calibration, 1 process, {cores} threads: {torch_ips:.1f} images/s")
    print()
    print("| ranks | threads/rank | calibration images/s | vs 1 rank | vs PyTorch | reduction ms (gather / merge / "
          "broadcast) | bytes gathered | bytes broadcast | wall s |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    base = None
    for n in [int(r) for r in args.ranks.split(",")]:
        threads = max(1, cores // n)
        runs = [run_dbrq(args.binary, n, calib, args.batch, threads, os.path.join(tmp, f"s{n}.json"))
                for _ in range(args.reps)]
        t = min(runs, key=lambda r: r["calibrate_ms"] + r["vote_ms"])
        seconds = (t["calibrate_ms"] + t["vote_ms"]) / 1e3
        ips = args.images / seconds
        base = base or ips
        print(f"| {n} | {threads} | {ips:.1f} | {ips / base:.2f}x | {ips / torch_ips:.2f}x | {t['reduction_ms']:.1f} "
              f"({t['gather_ms']:.1f} / {t['merge_ms']:.1f} / {t['broadcast_ms']:.1f}) | {t['gathered_bytes']} | "
              f"{t['broadcast_bytes']} | {t['wall_s']:.1f} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
