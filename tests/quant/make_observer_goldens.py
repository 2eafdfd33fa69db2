#!/usr/bin/python3
"""Regenerates tests/quant/golden/observers.safetensors: calibration batches and what PyTorch 1.13's
observers make of them, read by tests/quant/observer_golden_test.cc.

Run with Debian's python (PyTorch 1.13 from python3-torch), from the workspace root:

    /usr/bin/python3 tests/quant/make_observer_goldens.py

Datasets (each a few batches, fed in order):
  int       values in [-3, 5] with both endpoints present in the first batch: integer histogram
            edges, so PyTorch 1.13's int() truncation of torch.histc's range changes nothing
  int_pos   a one-sided (post-ReLU-like) distribution in [0, 6] with integer endpoints
  real      non-integer ranges that grow from batch to batch (HistogramObserver upsamples and
            re-bins; 1.13 truncates the histc edges, which dbrq reproduces with
            ObserverSpec::torch_integer_edges)
  small     non-integer range inside (-1, 1): int() of both edges is 0, so torch.histc falls back to
            the data's own range
  w         4-D weights [8, 4, 3, 3] for the per-channel observers (ch_axis 0 and 1)

Names: "<dataset>.batch<i>" (f32 data), "<dataset>.<observer>.<field>" with fields scale (f32),
zero_point (i64), min / max (f32: the observer's min_val / max_val after all batches). The file is
written by hand (8-byte little-endian header length, JSON header, raw little-endian data) because
Debian has no safetensors package.
"""

import os
import sys

import torch
from torch.ao.quantization.observer import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PerChannelMinMaxObserver,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torch_zoo  # noqa: E402  (the safetensors writer)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "observers.safetensors")

DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}

tensors = {}


def put(name, t):
    assert name not in tensors, name
    t = t.detach()
    assert t.dtype in DTYPES, (name, t.dtype)
    tensors[name] = t.contiguous().clone()


def write_safetensors(path, named):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch_zoo.write_safetensors(path, sorted(named.items()),
                                {"generator": "tests/quant/make_observer_goldens.py", "torch": torch.__version__})


def gen(seed, shape, scale, shift):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale + shift


def datasets():
    shape = (4, 3, 8, 8)
    d = {}
    # [-3, 5] with exact integer endpoints in batch 0; later batches stay inside.
    b = []
    for i in range(4):
        x = gen(100 + i, shape, 1.4, 0.6).clamp(-2.9, 4.9)
        if i == 0:
            x.view(-1)[0] = -3.0
            x.view(-1)[1] = 5.0
        b.append(x)
    d["int"] = b
    # One-sided: [0, 6].
    b = []
    for i in range(3):
        x = gen(200 + i, shape, 1.5, 0.5).abs().clamp(max=5.9)
        x.view(-1)[3] = 0.0
        if i == 0:
            x.view(-1)[5] = 6.0
        b.append(x)
    d["int_pos"] = b
    # Non-integer, growing ranges (with a heavy-ish tail in the last batch).
    b = []
    for i in range(4):
        x = gen(300 + i, shape, 0.9 + 0.35 * i, 0.37)
        b.append(x)
    b[3].view(-1)[7] = 9.3721
    d["real"] = b
    # Inside (-1, 1), non-integer.
    d["small"] = [gen(400 + i, shape, 0.21, 0.05).clamp(-0.93, 0.97) for i in range(3)]
    return d


def record(prefix, obs, batches, with_range=True):
    for x in batches:
        obs(x)
    scale, zp = obs.calculate_qparams()
    put(prefix + ".scale", scale.to(torch.float32).reshape(-1))
    put(prefix + ".zero_point", zp.to(torch.int64).reshape(-1))
    if with_range:
        put(prefix + ".min", obs.min_val.reshape(-1).clone())
        put(prefix + ".max", obs.max_val.reshape(-1).clone())


def main():
    torch.manual_seed(0)
    for name, batches in datasets().items():
        for i, x in enumerate(batches):
            put("%s.batch%d" % (name, i), x)
        put(name + ".num_batches", torch.tensor([len(batches)], dtype=torch.int64))
        record(name + ".minmax_u8", MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine), batches)
        record(name + ".minmax_u8_rr",
               MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=True), batches)
        record(name + ".minmax_s8_sym", MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
               batches)
        record(name + ".minmax_s8_sym_rr",
               MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, reduce_range=True), batches)
        record(name + ".mavg_u8", MovingAverageMinMaxObserver(dtype=torch.quint8), batches)
        record(name + ".mavg_u8_c05", MovingAverageMinMaxObserver(averaging_constant=0.5, dtype=torch.quint8),
               batches)
        record(name + ".hist_u8", HistogramObserver(bins=2048, dtype=torch.quint8), batches)
        record(name + ".hist_s8_sym", HistogramObserver(bins=2048, dtype=torch.qint8,
                                                         qscheme=torch.per_tensor_symmetric), batches)

    g = torch.Generator().manual_seed(500)
    w = [torch.randn((8, 4, 3, 3), generator=g) * torch.linspace(0.05, 1.3, 8).reshape(8, 1, 1, 1)
         for _ in range(2)]
    w[1].view(-1)[0] = 0.0  # a channel range touching zero
    for i, x in enumerate(w):
        put("w.batch%d" % i, x)
    for axis in (0, 1):
        obs = PerChannelMinMaxObserver(ch_axis=axis, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        for x in w:
            obs(x)
        scale, zp = obs.calculate_qparams()
        put("w.pc_s8_ax%d.scale" % axis, scale.to(torch.float32))
        put("w.pc_s8_ax%d.zero_point" % axis, zp.to(torch.int64))
        put("w.pc_s8_ax%d.min" % axis, obs.min_val.clone())
        put("w.pc_s8_ax%d.max" % axis, obs.max_val.clone())
    write_safetensors(OUT_PATH, tensors)
    print("wrote %d tensors to %s" % (len(tensors), OUT_PATH))


if __name__ == "__main__":
    main()
