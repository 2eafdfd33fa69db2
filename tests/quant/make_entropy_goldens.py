#!/usr/bin/python3
"""Goldens for dbrq's Entropy observer: the threshold NVIDIA pytorch-quantization's entropy
calibrator (calib/histogram.py _compute_amax_entropy, the TensorRT KL-divergence search) picks on
fixed histograms of |x|. The reference below is a plain NumPy port of that function (scipy's
entropy() written out, since Debian's python here has no scipy), kept deliberately naive.

Run `/usr/bin/python3 tests/quant/make_entropy_goldens.py` (about a minute) to regenerate
tests/quant/golden/entropy.safetensors. Names, per case "<c>":
  <c>.hist     f32 [2048]  the histogram of |x| over [0, abs_max]
  <c>.abs_max  f32 [1]
  <c>.min, <c>.max  f32 [1]  the data's min / max (min >= 0: unsigned, 256 levels; else 128)
  <c>.bin      i64 [1]  the chosen candidate i (threshold = abs_max * i / 2048)
"""

import os
import sys
from collections import Counter

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torch_zoo  # noqa: E402  (the safetensors writer)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "entropy.safetensors")
BINS = 2048


def kl(p, q):
    """scipy.stats.entropy(p, q): both normalized, sum p log(p/q), inf where q == 0 < p."""
    p = np.asarray(p, float) / np.sum(p)
    q = np.asarray(q, float) / np.sum(q)
    total = 0.0
    for pk, qk in zip(p, q):
        if pk > 0:
            total += np.inf if qk == 0 else pk * np.log(pk / qk)
    return total


def reference_bin(hist, unsigned, num_bits=8, start_bin=128):
    bins = np.array(hist, dtype=np.float64)
    bins[0] = bins[1]
    nbins = 1 << (num_bits - 1 + int(unsigned))
    divergences, arguments = [], []
    for i in range(start_bin, len(bins) + 1):
        counts = np.zeros(nbins)
        space = np.linspace(0, i, num=nbins + 1)
        digitized = np.digitize(range(i), space) - 1
        digitized[bins[:i] == 0] = -1
        for idx, d in enumerate(digitized):
            if d != -1:
                counts[d] += bins[idx]
        for key, val in Counter(digitized).items():
            if key != -1:
                counts[key] /= val
        new_density = np.zeros(i)
        for idx, d in enumerate(digitized):
            if d != -1:
                new_density[idx] = counts[d]
        reference = np.array(bins[:i])
        reference[-1] += np.sum(bins[i:])
        divergences.append(kl(reference, new_density))
        arguments.append(i)
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return arguments[last_argmin]


def cases():
    g = torch.Generator().manual_seed(1234)
    n = 200000
    x = torch.randn(n, generator=g)
    yield "relu_normal", torch.relu(x)  # half the mass at exactly 0, as after conv + ReLU
    e = torch.empty(n).exponential_(1.0, generator=g)
    e[torch.rand(n, generator=g) < 0.4] = 0.0
    yield "relu_exponential", e
    h = torch.randn(n, generator=g).abs() * 2.0
    h[:20] = torch.linspace(12.0, 30.0, 20)  # a few far outliers
    yield "halfnormal_outliers", h
    s = torch.randn(n, generator=g)
    s[:10] = torch.linspace(-25.0, 25.0, 10)
    yield "signed_outliers", s
    lap = torch.distributions.Laplace(0.0, 1.0).sample((n,))  # uses the global generator
    yield "signed_laplace", lap


def main():
    torch.manual_seed(99)
    tensors = []
    for name, x in cases():
        a = x.abs()
        abs_max = float(a.max())
        hist = torch.histc(a.double(), bins=BINS, min=0.0, max=abs_max)
        unsigned = float(x.min()) >= 0
        b = reference_bin(hist.numpy(), unsigned)
        print(f"{name}: unsigned={unsigned} bin {b} threshold {abs_max * b / BINS:.4f} of {abs_max:.4f}, "
              f"clips {float((a > abs_max * b / BINS).double().mean()):.5f} of the samples")
        tensors += [(name + ".hist", hist.float()), (name + ".abs_max", torch.tensor([abs_max])),
                    (name + ".min", torch.tensor([float(x.min())])), (name + ".max", torch.tensor([float(x.max())])),
                    (name + ".bin", torch.tensor([b], dtype=torch.int64))]
    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    torch_zoo.write_safetensors(OUT_PATH, sorted(tensors),
                                {"generator": "tests/quant/make_entropy_goldens.py", "torch": torch.__version__})


if __name__ == "__main__":
    main()
