"""The full-size ViT's int8 output SQNR vs PyTorch fp32: PyTorch FX (onednn default) against dbrq's
default mapping, its transformer recipe and the recipe after bias correction, on the same weights
and calibration images (bench/torch_models.py; the benchmark's calibration). Drives
bench/dbrq_bench --serve as bench/compare.py does; prints one line for the benchmark's batch-1 and
batch-8 inputs and one pooled over 64 held-out images (the row to rank by: docs/default_qconfig.md).

    bazel build -c opt //bench:dbrq_bench
    /usr/bin/python3 bench/vit_sqnr.py [--seed 16]   # 16: the ViT's seed in compare.sh --only=...,vit
    /usr/bin/python3 bench/vit_sqnr.py --recipes default --observers Histogram+torch_edges,Mse
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
    ap.add_argument("--observers", default="",
                    help="comma-separated activation observers to add as rows of the default recipe: an "
                         "ObserverKind name (Mse, Percentile, ...) or Histogram+torch_edges")
    ap.add_argument("--recipes", default="default,transformer,transformer_bc")
    ap.add_argument("--eval_batches", type=int, default=8,
                    help="held-out batches of 8 images (own generator) for the pooled row; 0: none")
    args = ap.parse_args()
    torch.backends.quantized.engine = "onednn"
    torch.set_num_threads(1)
    name = "vit"
    model = tm.make_model(name, seed=args.seed)
    inputs = tm.make_inputs(name, seed=args.seed + 10)
    calib = tm.calibration(inputs, name)
    # Held out: batch 1 is one image's logits and batch 8 eight, so those rows move by a dB with
    # the images drawn; the pooled row is SQNR over every held-out image's logits at once.
    g = torch.Generator().manual_seed(args.seed + 1000)
    hw = tm.VIT_FULL["image_size"]
    held_out = [torch.randn(8, 3, hw, hw, generator=g) for _ in range(args.eval_batches)]
    inputs.update({f"x_eval{k}": x for k, x in enumerate(held_out)})
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
    runs = [(r, "") for r in args.recipes.split(",") if r]
    runs += [("default", o) for o in args.observers.split(",") if o]
    rows = [(f"batch {bs}:", bs, [tm.timed_input(inputs, name, bs)], [None]) for bs in (1, 8)]
    if held_out:
        rows.append((f"{8 * len(held_out)} held-out images:", 8, held_out, [f"x_eval{k}" for k in range(len(held_out))]))
    with torch.inference_mode():
        fx_model = tm.fx_int8(model, tm.example(inputs, name), calib)
    for label, bs, xs, keys in rows:
        with torch.inference_mode():
            ref = torch.cat([model(x) for x in xs])
            fx = torch.cat([fx_model(x) for x in xs])
        row = [label, f"FX {sqnr_db(fx, ref):.2f}"]
        for recipe, observer in runs:
            ys = []
            for key in keys:
                extra = {"input_key": key} if key else {}
                call(cmd="setup", model=name, mode="int8", batch=bs, threads=1, weights=w, inputs=i, recipe=recipe,
                     observer=observer, **extra)
                call(cmd="save_output", path=out)
                ys.append(tm.read_safetensors(out)["output"])
            row.append(f"dbrq {observer or recipe} {sqnr_db(torch.cat(ys), ref):.2f}")
        print("  ".join(row), flush=True)
    server.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
    server.stdin.close()
    server.wait()


if __name__ == "__main__":
    main()
