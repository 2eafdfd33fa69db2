#!/usr/bin/python3
"""PyTorch FX int8 references for the other chains PyTorch folds a batch norm into (issue 13):
linear + batch_norm1d (+ relu) and conv1d + batch_norm1d (+ relu).

    /usr/bin/python3 tests/quant/make_fold_goldens.py

Writes tests/quant/golden/fold_chains_fx.safetensors, read by tests/quant/fold_chains_fx_test.cc:
  <model>.<state-dict key>   the weights (random, batch-norm statistics randomized)
  <model>.calib              calibration inputs (FX and dbrq calibrate on batches of CALIB_BATCH)
  <model>.eval, <model>.fx   evaluation inputs and FX's int8 outputs (prepare_fx in eval mode,
                             MinMax u8 activations, per-tensor symmetric s8 weights, onednn)
for model "linear_bn" (fc1 12->16, bn1, relu1, fc2 16->5) and "conv1d_bn" (conv1 4->8 k3 pad 1,
bn1, relu1, conv2 8->6 k3). Deterministic (fixed seed, one thread).
"""

import copy
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from torch_zoo import write_safetensors  # noqa: E402

CALIB_BATCH = 16


class LinearBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.bn1 = nn.BatchNorm1d(16)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(self.relu1(self.bn1(self.fc1(x))))


class Conv1dBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(4, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm1d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv1d(8, 6, 3)

    def forward(self, x):
        return self.conv2(self.relu1(self.bn1(self.conv1(x))))


def randomize_bn(bn, gen):
    c = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
        bn.running_var.copy_(0.2 + torch.rand(c, generator=gen) * 2)
        bn.weight.copy_(torch.randn(c, generator=gen))
        bn.bias.copy_(torch.randn(c, generator=gen) * 0.3)


def fx_int8(model, calib, evals):
    from torch.ao.quantization import MinMaxObserver, QConfig, QConfigMapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.backends.quantized.engine = "onednn"
    act = MinMaxObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=False)
    w = MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    prepared = prepare_fx(copy.deepcopy(model).eval(), QConfigMapping().set_global(QConfig(activation=act, weight=w)),
                          example_inputs=(calib[:1],))
    with torch.no_grad():
        for i in range(0, len(calib), CALIB_BATCH):
            prepared(calib[i:i + CALIB_BATCH])
    converted = convert_fx(prepared)
    with torch.no_grad():
        return converted(evals), converted.code


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(13)
    torch.manual_seed(13)
    tensors = []
    codes = {}
    for name, model, shape in (("linear_bn", LinearBn(), (12,)), ("conv1d_bn", Conv1dBn(), (4, 20))):
        randomize_bn(model.bn1, gen)
        model.eval()
        calib = torch.randn(64, *shape, generator=gen)
        evals = torch.randn(40, *shape, generator=gen)
        fx, code = fx_int8(model, calib, evals)
        codes[name] = code
        tensors += [(f"{name}.{k}", v) for k, v in model.state_dict().items()]
        tensors += [(f"{name}.calib", calib), (f"{name}.eval", evals), (f"{name}.fx", fx)]
    path = os.path.join(HERE, "golden", "fold_chains_fx.safetensors")
    write_safetensors(path, tensors, {"torch": torch.__version__, "calib_batch": str(CALIB_BATCH),
                                      "fx_code_linear_bn": codes["linear_bn"], "fx_code_conv1d_bn": codes["conv1d_bn"]})
    print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes)")
    print(codes["linear_bn"], codes["conv1d_bn"])


if __name__ == "__main__":
    main()
