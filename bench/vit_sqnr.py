"""The full-size ViT's int8 output SQNR vs PyTorch fp32: PyTorch FX (onednn default) against dbrq's
default mapping, its transformer recipe and the recipe after bias correction, on the same weights
and calibration images (bench/torch_models.py; the benchmark's calibration). Drives
bench/dbrq_bench --serve as bench/compare.py does; prints one line per batch size.

    bazel build -c opt //bench:dbrq_bench
    /usr/bin/python3 bench/vit_sqnr.py [--seed 16]   # 16: the ViT's seed in compare.sh --only=...,vit
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402


def sqnr_db(y, ref):
    ref = ref.double()
    return 10 * torch.log10((ref ** 2).sum() / ((y.double() - ref) ** 2).sum()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=16, help="weights seed (inputs: seed + 10)")
    ap.add_argument("--dbrq_bench", default="bazel-out/k8-opt/bin/bench/dbrq_bench")
    args = ap.parse_args()
    torch.backends.quantized.engine = "onednn"
    torch.set_num_threads(1)
    name = "vit"
    model = tm.make_model(name, seed=args.seed)
    inputs = tm.make_inputs(name, seed=args.seed + 10)
    calib = tm.calibration(inputs, name)
    work = tempfile.TemporaryDirectory(prefix="dbrq_vit_")
    w, i, out = (os.path.join(work.name, f) for f in ("w.safetensors", "in.safetensors", "y.safetensors"))
    tm.write_safetensors(w, model.state_dict().items())
    tm.write_safetensors(i, inputs.items())
    server = subprocess.Popen([args.dbrq_bench, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)

    def call(**cmd):
        server.stdin.write(json.dumps(cmd) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        while line and not line.startswith("{"):
            line = server.stdout.readline()
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(reply)
        return reply

    print(f"vit seed {args.seed}: int8 output SQNR vs PyTorch fp32 (dB)")
    for bs in (1, 8):
        x = tm.timed_input(inputs, name, bs)
        with torch.inference_mode():
            ref = model(x)
            fx = tm.fx_int8(model, x, calib)(x)
        row = [f"batch {bs}:", f"FX {sqnr_db(fx, ref):.2f}"]
        for recipe in ("default", "transformer", "transformer_bc"):
            call(cmd="setup", model=name, mode="int8", batch=bs, threads=1, weights=w, inputs=i, recipe=recipe)
            call(cmd="save_output", path=out)
            row.append(f"dbrq {recipe} {sqnr_db(tm.read_safetensors(out)['output'], ref):.2f}")
        print("  ".join(row), flush=True)
    server.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
    server.stdin.close()
    server.wait()


if __name__ == "__main__":
    main()
