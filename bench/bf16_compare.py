#!/usr/bin/python3
"""bf16 as a middle precision, dbrq vs PyTorch 1.13 in the same run.

Runs bench:bf16_bench (dbrq fp32 / bf16 / int8 of one layer, which also writes the layer's weights
and input), then times the same layer in PyTorch fp32 and bf16 (weights converted once, the input
converted to bf16 and the output back to f32 on every call: the same f32 boundaries as dbrq's
QConfig::bf16()). Prints a table and, as the last line, JSON with the ratios (dbrq / PyTorch, lower
is better for dbrq) and the SQNRs vs fp32.

    bazel build -c opt //bench:bf16_bench
    /usr/bin/python3 bench/bf16_compare.py bazel-bin/bench/bf16_bench --iters=50
"""
import argparse
import json
import os
import struct
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", meta
        a, b = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(meta["shape"])
    return out


def times_ms(fn, iters):
    """(median, min) in ms of `iters` calls after one warm-up."""
    fn()
    t = []
    for _ in range(iters):
        s = time.perf_counter()
        fn()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return t[len(t) // 2], t[0]


def rounds(fa, fb, iters):
    """Interleaved rounds of fa and fb (as the dbrq side does): median of medians, min of mins."""
    a, b = [], []
    for _ in range(5):
        a.append(times_ms(fa, iters))
        b.append(times_ms(fb, iters))
    med = lambda v: sorted(x[0] for x in v)[len(v) // 2]
    return (med(a), min(x[1] for x in a)), (med(b), min(x[1] for x in b))


def sqnr(ref, x):
    err = (ref - x).double().pow(2).sum().item()
    return float("inf") if err == 0 else 10 * torch.log10(ref.double().pow(2).sum() / err).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([a.bench, str(a.iters), d], check=True, capture_output=True, text=True, env=env).stdout
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        result = {}
        print("times in ms, median (min); ratios of medians (of mins)")
        print(f"{'case':22} {'dbrq fp32':>15} {'dbrq bf16':>15} {'dbrq int8':>15} {'torch fp32':>15} {'torch bf16':>15}"
              f" {'bf16 dbrq/torch':>16} {'SQNR dbrq':>10} {'SQNR torch':>11}")
        for r in rows:
            t = load_safetensors(os.path.join(d, r["case"] + ".safetensors"))
            x, w, b = t["input"], t["layer.weight"], t["layer.bias"]
            with torch.no_grad():
                if x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                    f32 = lambda: F.conv2d(x, w, b, padding=1)
                    wb, bb = w.bfloat16().contiguous(memory_format=torch.channels_last), b.bfloat16()
                    bf = lambda: F.conv2d(x.bfloat16(), wb, bb, padding=1).float()
                else:
                    f32 = lambda: F.linear(x, w, b)
                    wb, bb = w.bfloat16(), b.bfloat16()
                    bf = lambda: F.linear(x.bfloat16(), wb, bb).float()
                ref = f32()
                (tf, tf_min), (tb, tb_min) = rounds(f32, bf, a.iters)
                s_torch = sqnr(ref, bf())
            c = r["case"]
            ratio = r["dbrq_bf16_ms"] / tb
            ratio_min = r["dbrq_bf16_min_ms"] / tb_min
            cell = lambda m, n: f"{m:.2f} ({n:.2f})"
            print(f"{c:22} {cell(r['dbrq_fp32_ms'], r['dbrq_fp32_min_ms']):>15} {cell(r['dbrq_bf16_ms'], r['dbrq_bf16_min_ms']):>15}"
                  f" {cell(r['dbrq_int8_ms'], r['dbrq_int8_min_ms']):>15} {cell(tf, tf_min):>15} {cell(tb, tb_min):>15}"
                  f" {cell(ratio, ratio_min):>16} {r['dbrq_bf16_sqnr_db']:10.1f} {s_torch:11.1f}")
            result[f"{c}_bf16_vs_torch_bf16"] = ratio
            result[f"{c}_bf16_vs_torch_bf16_min"] = ratio_min
            result[f"{c}_bf16_vs_dbrq_fp32_min"] = r["dbrq_bf16_min_ms"] / r["dbrq_fp32_min_ms"]
            result[f"{c}_bf16_vs_dbrq_fp32"] = r["dbrq_bf16_ms"] / r["dbrq_fp32_ms"]
            result[f"{c}_fp32_vs_torch_fp32"] = r["dbrq_fp32_ms"] / tf
            result[f"{c}_dbrq_bf16_sqnr_db"] = r["dbrq_bf16_sqnr_db"]
            result[f"{c}_torch_bf16_sqnr_db"] = s_torch
            result[f"{c}_dbrq_int8_sqnr_db"] = r["dbrq_int8_sqnr_db"]
        result["meta"] = {"threads": a.threads, "iters": a.iters, "bf16_hardware": rows[0]["bf16_hardware"],
                          "load_avg": os.getloadavg()[0]}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
