#!/usr/bin/python3
"""dbrq's default qconfig vs PyTorch FX's default, on every zoo model: int8 output SQNR vs fp32.

    bazel build -c opt //bench:qconfig_table
    /usr/bin/python3 bench/qconfig_table.py [--kinds default,Mse,...] [--models a,b] [--json out.json]

For each model, both sides get the same weights and the same calibration and evaluation batches:

- the zoo models in their reduced ("tiny") configuration with the weights of the zoo golden files
  (tests/models/golden/<model>.safetensors, written by tests/models/make_model_goldens.py, whose
  configurations, input generators and FX qconfig this script imports);
- small_cnn_digits: zoo SmallCnn trained on scikit-learn's digits (samples/data/, written by
  tools/train_digits.py), calibrated on digits_calib and evaluated on digits_test, with accuracy.

PyTorch: prepare_fx with get_default_qconfig_mapping("onednn") (ConvTranspose2d weights
per-tensor: FX 1.13 refuses per-channel ones; make_model_goldens.fx_qconfig_mapping), calibration
on every batch in order, convert_fx, onednn engine. dbrq: bench/qconfig_table.cc, which starts from
default_qconfig_mapping("onednn") and replaces the global activation observer by each kind of
--kinds ("default" leaves the mapping as it is). SQNR is 10 log10(sum ref^2 / sum (out - ref)^2)
over all evaluation outputs, ref being the model's float64 output (make_model_goldens'
reference_output). The last line printed is one JSON object; a markdown table precedes it.
"""

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
import make_model_goldens as mg  # noqa: E402
from torch_zoo import (BertEncoder, DcganGenerator, DecoderLM, DecoderLogits, KwsConv1d, ResNet18W,  # noqa: E402
                       SmallCnn, UNet, VisionTransformer, densenet, positions_of, read_safetensors,
                       write_safetensors)
from torchvision.models.mobilenetv2 import MobileNetV2  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "models", "golden")
DATA = os.path.join(ROOT, "samples", "data")
CALIB_BATCHES = 4  # of 8 samples each (32 calibration samples per model)
EVAL_BATCHES = 2   # of 16 samples each


# FX 1.13 cannot trace the shape-dependent factories of the BERT embeddings (torch.arange of a
# traced length) and of the decoder (arange, and `if s > 1` on a traced size). The table runs
# them through forwards that compute the same function with positions and the causal mask derived
# from the data (cumsum of ones), which traces; no weight or state-dict key changes (the decoder's:
# torch_zoo.DecoderLogits).
def bert_embeddings_forward(self, input_ids):
    positions = positions_of(input_ids)
    x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
    x = x + self.token_type_embeddings(torch.zeros_like(input_ids))
    return self.dropout(self.LayerNorm(x))


def traceable_bert(c):
    m = BertEncoder(c)
    e = m.embeddings
    e.forward = types.MethodType(bert_embeddings_forward, e)
    return m


def traceable_decoder(c):
    return DecoderLogits(DecoderLM(c))


def images(c, hw):
    return lambda n, g: torch.randn(n, c, hw, hw, generator=g)


def token_ids(vocab, seq):
    return lambda n, g: torch.randint(0, vocab, (n, seq), generator=g, dtype=torch.int64)


# name -> (torch model builder, input generator (n, generator) -> batch)
ZOO = {
    "resnet18": (lambda: ResNet18W(**mg.RESNET_TINY), images(3, 64)),
    "mobilenet_v2": (lambda: MobileNetV2(**mg.MOBILENET_TINY), images(3, 64)),
    "bert_encoder": (lambda: traceable_bert(mg.BERT_TINY), token_ids(mg.BERT_TINY["vocab_size"], 16)),
    "vit": (lambda: VisionTransformer(mg.VIT_TINY), images(3, mg.VIT_TINY["image_size"])),
    "unet": (lambda: UNet(**mg.UNET_TINY), lambda n, g: mg.smooth_images(n, 3, mg.UNET_TINY_HW, g)),
    "densenet": (lambda: densenet(**mg.DENSENET_TINY), images(3, 32)),
    "kws_conv1d": (lambda: KwsConv1d(**mg.KWS_TINY),
                   lambda n, g: mg.mfcc_like(n, mg.KWS_TINY["n_mfcc"], mg.KWS_FRAMES, g)),
    "dcgan_generator": (lambda: DcganGenerator(**mg.DCGAN_TINY),
                        lambda n, g: torch.randn(n, mg.DCGAN_TINY["nz"], 1, 1, generator=g)),
    "decoder_lm": (lambda: traceable_decoder(mg.DECODER_TINY), token_ids(mg.DECODER_TINY["vocab_size"], 8)),
}
ORDER = ["small_cnn_digits"] + list(ZOO)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sqnr_db(x, ref):
    x, ref = x.double().reshape(-1), ref.double().reshape(-1)
    noise = float((x - ref).pow(2).sum())
    return 10 * math.log10(float(ref.pow(2).sum()) / noise) if noise > 0 else float("inf")


def load_weights(model, path):
    tensors = read_safetensors(path)
    inner = model.lm if isinstance(model, DecoderLogits) else model
    inner.load_state_dict({k: tensors[k] for k in inner.state_dict()})
    return model.eval()


def case(name, data_seed=1300):
    """(torch model, weights file, dbrq zoo name, example, calib batches, eval batches, labels or None)."""
    if name == "small_cnn_digits":
        weights = os.path.join(DATA, "digits_small_cnn.safetensors")
        model = load_weights(SmallCnn(**mg.SMALL_CNN), weights)
        calib = read_safetensors(os.path.join(DATA, "digits_calib.safetensors"))["images"]
        test = read_safetensors(os.path.join(DATA, "digits_test.safetensors"))
        batches = [calib[i:i + 8] for i in range(0, calib.shape[0], 8)]
        evals = [test["images"]]
        return model, weights, "small_cnn", batches[0][:1].clone(), batches, evals, test["labels"]
    build, gen_input = ZOO[name]
    weights = os.path.join(GOLDEN, f"{name}.safetensors")
    model = load_weights(build(), weights)
    g = torch.Generator().manual_seed(data_seed + ORDER.index(name))
    calib = [gen_input(8, g) for _ in range(CALIB_BATCHES)]
    evals = [gen_input(16, g) for _ in range(EVAL_BATCHES)]
    return model, weights, name, calib[0][:1].clone(), calib, evals, None


def fx_outputs(model, example, calib, evals):
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    import copy

    torch.backends.quantized.engine = "onednn"
    prepared = prepare_fx(copy.deepcopy(model), mg.fx_qconfig_mapping(), example_inputs=(example,))
    with torch.no_grad():
        for b in calib:
            prepared(b)
        q = convert_fx(prepared)
        return [q(x) for x in evals]


def dbrq_outputs(tool, zoo_name, weights, data_path, kind, tmp):
    out = os.path.join(tmp, f"out_{kind.replace('+', '_')}.safetensors")
    cmd = [tool, "--model", zoo_name, "--variant", "tiny", "--weights", weights, "--data", data_path, "--act", kind,
           "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    t = read_safetensors(out)
    n = sum(1 for k in t if k.startswith("int8_"))
    return [t[f"int8_{k}"] for k in range(n)], [t[f"fp32_{k}"] for k in range(n)], float(t["convert_ms"][0])


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="default,Mse,Histogram+torch_edges",
                    help="dbrq activation observers to compare (comma-separated)")
    ap.add_argument("--models", default=",".join(ORDER))
    ap.add_argument("--tool", default=os.path.join(ROOT, "bazel-bin", "bench", "qconfig_table"))
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--data_seed", type=int, default=1300,
                    help="calibration and evaluation inputs are drawn under data_seed + the model's index in the "
                         "table (the zoo models; the digits data are fixed). 1300: the table in "
                         "docs/default_qconfig.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic reductions, as the golden scripts
    kinds = args.kinds.split(",")
    rows = []
    for name in args.models.split(","):
        model, weights, zoo_name, example, calib, evals, labels = case(name, args.data_seed)
        row = {"model": name}
        with torch.no_grad():
            ref = torch.cat([mg.reference_output(model, x) for x in evals])
        try:
            fx = torch.cat(fx_outputs(model, example, calib, evals))
            row["fx_sqnr_db"] = sqnr_db(fx, ref)
            if labels is not None:
                row["fx_accuracy"] = float((fx.argmax(1) == labels).double().mean())
        except Exception as e:  # noqa: BLE001  (FX cannot trace every model; the row says why)
            row["fx_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            log(f"{name}: FX failed: {row['fx_error']}")
        if labels is not None:
            row["fp32_accuracy"] = float((ref.argmax(1) == labels).double().mean())
        with tempfile.TemporaryDirectory() as tmp:
            data_path = os.path.join(tmp, "data.safetensors")
            tensors = [("example", example)] + [(f"calib{k}", b) for k, b in enumerate(calib)]
            tensors += [(f"eval{k}", x) for k, x in enumerate(evals)]
            write_safetensors(data_path, tensors)
            for kind in kinds:
                q, f32, convert_ms = dbrq_outputs(args.tool, zoo_name, weights, data_path, kind, tmp)
                q = torch.cat(q)
                row[f"{kind}_sqnr_db"] = sqnr_db(q, ref)
                row[f"{kind}_convert_ms"] = convert_ms
                row["dbrq_fp32_sqnr_db"] = sqnr_db(torch.cat(f32), ref)
                if labels is not None:
                    row[f"{kind}_accuracy"] = float((q.argmax(1) == labels).double().mean())
        log(json.dumps(row))
        rows.append(row)

    date = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"CPU: {cpu_model()}; {date}; load average {load} at the end; torch {torch.__version__}")
    head = ["model", "FX default"] + [f"dbrq {k}" for k in kinds] + [f"{k} - FX" for k in kinds]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        fx = r.get("fx_sqnr_db")
        cells = [r["model"], fmt(fx) if fx is not None else "FX fails"]
        cells += [fmt(r[f"{k}_sqnr_db"]) for k in kinds]
        cells += [fmt(r[f"{k}_sqnr_db"] - fx) if fx is not None else "n/a" for k in kinds]
        print("| " + " | ".join(cells) + " |")
        if "fp32_accuracy" in r:
            acc = [f"fp32 {100 * r['fp32_accuracy']:.2f}%", f"FX {100 * r.get('fx_accuracy', float('nan')):.2f}%"]
            acc += [f"{k} {100 * r[f'{k}_accuracy']:.2f}%" for k in kinds]
            print(f"|  accuracy: {', '.join(acc)} |" + " |" * (len(head) - 1))
    result = {"cpu": cpu_model(), "date": date, "load": load, "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
