#!/usr/bin/python3
"""Trains a small residual CNN on the bundled digits data and writes PyTorch FX's int8 logits for it.

    /usr/bin/python3 tools/train_digits_residual.py     # Debian's python3 (PyTorch 1.13, scikit-learn)

The model (mirrored in C++ by tests/models/digits_residual.h, same layer names and order):

    conv1 (1->16, 3x3, pad 1, no bias) + bn1 + relu1      8x8
    conv2 (16->32, 3x3, pad 1, no bias) + bn2 + relu2     8x8
    pool (max 2x2)                                        4x4
    y + relu3(bn3(conv3(y)))   conv3 32->32, 3x3, pad 1, no bias
    conv4 (32->64, 3x3, pad 1) + relu4
    avgpool (adaptive 1x1), flatten, fc (64->10)

It trains on tools/train_digits.py's training split (same shuffle, same seed, so the calibration and
test images are the ones in samples/data/digits_{calib,test}.safetensors, checked here) and writes:

  samples/data/digits_residual.safetensors       the trained weights (state-dict keys as above)
  tests/models/golden/digits_residual_int8.safetensors
      "fp32"                 [360, 10] PyTorch's fp32 logits on every test image
      "fx_minmax_per_tensor" [360, 10] FX int8 logits: MinMaxObserver u8 affine activations,
                             MinMaxObserver s8 per-tensor symmetric weights
      "fx_minmax_per_channel"[360, 10] FX int8 logits: MinMaxObserver u8 affine activations,
                             PerChannelMinMaxObserver s8 per-channel symmetric weights
  Both: prepare_fx (eval mode: batch norm folded into the convs before calibrating), calibrated on
  the 256 calibration images in batches of CALIB_BATCH, in order, convert_fx, onednn engine.

Deterministic: fixed seeds, one thread, deterministic algorithms; rerunning reproduces the files
byte for byte on the same PyTorch build.
"""

import copy
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_zoo import read_safetensors, write_safetensors  # noqa: E402
import train_digits  # noqa: E402  (its splits and training loop)

ROOT = os.path.dirname(HERE)
DATA_DIR = os.path.join(ROOT, "samples", "data")
GOLDEN_DIR = os.path.join(ROOT, "tests", "models", "golden")

EPOCHS = 15
CALIB_BATCH = 32  # tests/models/digits_residual_test.cc calibrates the same way


class DigitsResidual(nn.Module):
    """Mirror of tests/models/digits_residual.h: same layers, same names, same order."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(32)
        self.relu3 = nn.ReLU()
        self.conv4 = nn.Conv2d(32, 64, 3, padding=1)
        self.relu4 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.pool(self.relu2(self.bn2(self.conv2(y))))
        y = y + self.relu3(self.bn3(self.conv3(y)))
        y = self.relu4(self.conv4(y))
        return self.fc(torch.flatten(self.avgpool(y), 1))


def fx_int8_logits(model, weight_observer, x_calib, x_test):
    from torch.ao.quantization import MinMaxObserver, QConfig, QConfigMapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "onednn"
    act = MinMaxObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False)
    mapping = QConfigMapping().set_global(QConfig(activation=act, weight=weight_observer))
    m = copy.deepcopy(model).eval()
    prepared = prepare_fx(m, mapping, example_inputs=(x_calib[:1],))
    with torch.no_grad():
        for i in range(0, len(x_calib), CALIB_BATCH):
            prepared(x_calib[i:i + CALIB_BATCH])
    converted = convert_fx(prepared)
    with torch.no_grad():
        return converted(x_test), converted.code


def main():
    mean, std, (x_train, y_train), (x_calib, y_calib), (x_test, y_test) = train_digits.load_splits()
    # The bundled splits must be exactly these (the C++ test reads them).
    for name, x, y in (("calib", x_calib, y_calib), ("test", x_test, y_test)):
        stored = read_safetensors(os.path.join(DATA_DIR, f"digits_{name}.safetensors"))
        if not (torch.equal(stored["images"], x) and torch.equal(stored["labels"], y)):
            sys.exit(f"samples/data/digits_{name}.safetensors differs from tools/train_digits.py's split")

    model = DigitsResidual()
    train_digits.fit(model, x_train, y_train, EPOCHS)

    model.eval()
    with torch.no_grad():
        fp32 = model(x_test)
    test_acc = (fp32.argmax(1) == y_test).float().mean().item()
    print(f"PyTorch fp32 test accuracy {test_acc * 100:.2f}% ({len(y_test)} images)")
    if test_acc < 0.95:
        sys.exit(f"test accuracy {test_acc:.4f} is below 0.95; not writing files")

    from torch.ao.quantization import MinMaxObserver, PerChannelMinMaxObserver
    per_tensor = MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    per_channel = PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    fx_pt, code = fx_int8_logits(model, per_tensor, x_calib, x_test)
    fx_pc, _ = fx_int8_logits(model, per_channel, x_calib, x_test)
    for name, q in (("per-tensor", fx_pt), ("per-channel", fx_pc)):
        acc = (q.argmax(1) == y_test).float().mean().item()
        sqnr = float(10 * torch.log10(fp32.pow(2).sum() / (fp32 - q).pow(2).sum()))
        print(f"FX int8 MinMax, {name} weights: accuracy {acc * 100:.2f}%, logit SQNR {sqnr:.2f} dB")

    common = {"source": "tools/train_digits_residual.py", "torch_version": torch.__version__,
              "normalization": "x = (pixel / 16 - mean) / std", "mean": repr(mean), "std": repr(std)}
    weights_path = os.path.join(DATA_DIR, "digits_residual.safetensors")
    write_safetensors(weights_path, list(model.state_dict().items()),
                      dict(common, model="digits_residual", torch_test_accuracy=f"{test_acc:.6f}"))
    golden_path = os.path.join(GOLDEN_DIR, "digits_residual_int8.safetensors")
    write_safetensors(golden_path, [("fp32", fp32), ("fx_minmax_per_tensor", fx_pt),
                                    ("fx_minmax_per_channel", fx_pc)],
                      dict(common, engine="onednn", calib_batch=str(CALIB_BATCH), fx_code=code))
    for p in (weights_path, golden_path):
        print(f"wrote {os.path.relpath(p, ROOT)} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
