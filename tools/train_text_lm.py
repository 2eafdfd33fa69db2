#!/usr/bin/python3
"""Trains a byte-level GPT-style language model on the license texts Debian ships, and writes
PyTorch's fp32 / FX int8 / quantize_dynamic bits per character on a held-out split.

    /usr/bin/python3 tools/train_text_lm.py           # Debian's python3 (PyTorch 1.13), ~10 min on one core
    /usr/bin/python3 tools/train_text_lm.py --eval-only   # keep the weights file, rewrite the golden

Text: every regular file of /usr/share/common-licenses (package base-files, present on every Debian
system; the symlinks GPL, LGPL, GFDL are skipped, they name files already read), in name order, as
raw bytes (vocabulary 256). Split: the first 90% of each file trains, the last 10% is held out. The
sha256 of the text and base-files' version are written to the golden so a different text is caught.

Model: zoo::DecoderLM (samples/zoo/decoder_lm.h; PyTorch twin torch_zoo.DecoderLM) with CONFIG below.

Writes:
  samples/data/text_lm.safetensors            the trained weights, stored F16 (dbrq loads F16 as f32);
                                              every number below uses exactly these rounded weights
  tests/models/golden/text_lm_golden.safetensors
      "eval"    [W, 65] u8  held-out windows: 64 input bytes, the model predicts bytes 1..64 of each
      "calib"   [32, 64] u8 calibration windows from the training split (seeded offsets)
      "fp32_nll" [W] f32   PyTorch fp32 summed negative log-likelihood (nats) of each eval window
      "fx_nll", "dynamic_nll" [W] f32  the same for FX int8 and quantize_dynamic
      metadata: fp32_bpc, fx_bpc, dynamic_bpc (bits per byte over every eval window), outlier ratios
      of the LayerNorm inputs and outputs on the calibration windows, the text's sha256, the configuration.

PyTorch int8: FX prepare_fx with get_default_qconfig_mapping("onednn") on the onednn engine,
calibrated on the 32 calibration windows (one batch), convert_fx; quantize_dynamic(model,
dtype=torch.qint8) (its default: every nn.Linear). FX 1.13 cannot trace the decoder's arange and
`if s > 1`, so FX and the fp32 reference run a forward computing the same function with positions
and the causal mask derived from the data (as bench/qconfig_table.py does).

Deterministic: fixed seed, one thread; rerunning reproduces the files on the same PyTorch build.
"""

import copy
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_zoo import DecoderLM, DecoderLogits, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(HERE)
TEXT_DIR = "/usr/share/common-licenses"
WEIGHTS = os.path.join(ROOT, "samples", "data", "text_lm.safetensors")
GOLDEN = os.path.join(ROOT, "tests", "models", "golden", "text_lm_golden.safetensors")

CONFIG = dict(vocab_size=256, d_model=128, num_layers=4, num_heads=4, d_ff=512, max_positions=64,
              layer_norm_eps=1e-5)
CONTEXT = 64
HELD_OUT = 0.1
SEED = 13
STEPS = int(os.environ.get("TEXT_LM_STEPS", "1200"))
BATCH = 32
LR = 2e-3
WARMUP = 100
WEIGHT_DECAY = 0.1
NUM_CALIB = 32


def read_text():
    names = sorted(n for n in os.listdir(TEXT_DIR)
                   if os.path.isfile(os.path.join(TEXT_DIR, n)) and not os.path.islink(os.path.join(TEXT_DIR, n)))
    train, held, digest = [], [], hashlib.sha256()
    for n in names:
        with open(os.path.join(TEXT_DIR, n), "rb") as f:
            data = f.read()
        digest.update(data)
        cut = int(len(data) * (1 - HELD_OUT))
        train.append(data[:cut])
        held.append(data[cut:])
    return names, train, held, digest.hexdigest()


def eval_windows(held):
    """Non-overlapping windows of CONTEXT + 1 bytes (stride CONTEXT) inside each file's held-out part:
    every held-out byte but the first of each file is predicted once, at most CONTEXT bytes of context."""
    rows = []
    for part in held:
        for s in range(0, len(part) - CONTEXT, CONTEXT):
            rows.append(list(part[s:s + CONTEXT + 1]))
    return torch.tensor(rows, dtype=torch.uint8)


def window_nll(model, windows, batch=64):
    """Summed NLL (nats) of bytes 1..CONTEXT of each window, given the bytes before it in the window."""
    out = []
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch].long()
            logits = model(w[:, :-1])
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1), reduction="none")
            out.append(nll.reshape(w.shape[0], -1).double().sum(1))
    return torch.cat(out)


def bpc(nll, windows):
    return float(nll.sum() / ((windows.shape[1] - 1) * windows.shape[0]) / math.log(2))


def outlier_ratios(model, calib):
    """Per LayerNorm, for its input (the residual stream) and its output (what the linears read): max over
    channels of max|x| divided by the median channel's max|x|, on the calibration windows."""
    stats, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.LayerNorm):
            def hook(mod, inp, out, name=name):
                stats[name] = [t.detach().abs().reshape(-1, t.shape[-1]).amax(0) for t in (inp[0], out)]
            hooks.append(m.register_forward_hook(hook))
    with torch.no_grad():
        model(calib.long())
    for h in hooks:
        h.remove()
    ratio = lambda v: round(float(v.max() / v.median()), 2)  # noqa: E731
    return ({k.replace("lm.", ""): ratio(v[0]) for k, v in stats.items()},
            {k.replace("lm.", ""): ratio(v[1]) for k, v in stats.items()})


def train(train_parts, log):
    torch.manual_seed(SEED)
    lm = DecoderLM(CONFIG)
    # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).
    for name, p in lm.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * CONFIG["num_layers"]) if name.endswith(("out_proj.weight", "fc_out.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)
    model = DecoderLogits(lm)
    data = torch.tensor(list(b"".join(train_parts)), dtype=torch.long)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(SEED)
    start = time.time()
    for step in range(STEPS):
        lr = LR * min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        for group in opt.param_groups:
            group["lr"] = lr
        offs = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
        w = torch.stack([data[o:o + CONTEXT + 1] for o in offs.tolist()])
        # bf16 autocast: Debian's PyTorch has generic BLAS (about 3 GFLOPS fp32 on one core), its bf16
        # matmuls run on oneDNN (about 100); the weights and the optimizer stay fp32.
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == STEPS - 1:
            log(f"step {step}/{STEPS} loss {loss.item() / math.log(2):.3f} bpc lr {lr:.2e} {time.time() - start:.0f}s")
    return lm, data


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.quantized.engine = "onednn"
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    names, train_parts, held, sha = read_text()
    log(f"text: {len(names)} files, {sum(map(len, train_parts))} train / {sum(map(len, held))} held-out bytes")
    data = torch.tensor(list(b"".join(train_parts)), dtype=torch.long)
    if "--eval-only" not in sys.argv:
        lm, _ = train(train_parts, log)
        # Round to the F16 file and evaluate exactly those weights.
        state = {k: v.detach().half() for k, v in lm.state_dict().items()}
        os.makedirs(os.path.dirname(WEIGHTS), exist_ok=True)
        write_safetensors(WEIGHTS, state.items(), {"config": json.dumps(CONFIG), "script": "tools/train_text_lm.py"})
    lm = DecoderLM(CONFIG)
    lm.load_state_dict({k: v.float() for k, v in read_safetensors(WEIGHTS).items()})
    lm.eval()
    model = DecoderLogits(lm).eval()

    evals = eval_windows(held)
    g = torch.Generator().manual_seed(SEED + 1)
    offs = torch.randint(0, len(data) - CONTEXT, (NUM_CALIB,), generator=g).tolist()
    calib = torch.stack([data[o:o + CONTEXT] for o in offs]).to(torch.uint8)

    fp32_nll = window_nll(model, evals)
    fp32 = bpc(fp32_nll, evals)
    log(f"fp32 held-out bpc {fp32:.4f} over {evals.shape[0]} windows")
    in_ratios, ratios = outlier_ratios(model, calib)
    log(f"LayerNorm input (residual stream) max/median channel ratio: {in_ratios}")
    log(f"LayerNorm output max/median channel ratio: {ratios}")

    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("onednn"), example_inputs=(calib[:1].long(),))
    with torch.no_grad():
        prepared(calib.long())
    fx_model = convert_fx(prepared)
    fx_nll = window_nll(fx_model, evals)
    fx = bpc(fx_nll, evals)
    dyn_model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), dtype=torch.qint8)
    dyn_nll = window_nll(dyn_model, evals)
    dyn = bpc(dyn_nll, evals)
    log(f"FX int8 bpc {fx:.4f}, quantize_dynamic bpc {dyn:.4f}")

    base_files = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "base-files"], capture_output=True,
                                text=True).stdout.strip()
    meta = {"fp32_bpc": repr(fp32), "fx_bpc": repr(fx), "dynamic_bpc": repr(dyn), "num_calib": str(NUM_CALIB),
            "text_sha256": sha, "text_files": ",".join(names), "base_files_version": base_files,
            "layernorm_outlier_ratio": json.dumps(ratios),
            "layernorm_input_outlier_ratio": json.dumps(in_ratios), "config": json.dumps(CONFIG), "steps": str(STEPS),
            "torch_version": torch.__version__, "script": "tools/train_text_lm.py"}
    write_safetensors(GOLDEN, [("eval", evals), ("calib", calib), ("fp32_nll", fp32_nll.float()),
                          ("fx_nll", fx_nll.float()), ("dynamic_nll", dyn_nll.float())], meta)
    log(f"wrote {GOLDEN}" if "--eval-only" in sys.argv else f"wrote {WEIGHTS} and {GOLDEN}")


if __name__ == "__main__":
    main()
