#!/usr/bin/python3
"""Regenerates tests/int8/golden/int8_norms.safetensors, read by int8_norms_golden_test.cc.

Run with Debian's interpreter (python3-torch 1.13), from anywhere:

    /usr/bin/python3 tests/int8/make_norm_goldens.py

Everything is seeded; rerunning rewrites an identical file.

One case per quantized normalization call, computed by PyTorch 1.13 (engine 'onednn'; these ops are
PyTorch's own quantized CPU kernels, quantized_normalize_kernel) on exactly the codes and
parameters dbrq's kernels get in the test. Tensors are named "<case>.<role>":

    x                  u8 input codes (logical NCHW order), x_scale F32[1], x_zp I32[1]
    w, b               f32 weight and bias (absent: the op ran without them)
    out                PyTorch's output codes (int_repr(), U8), out_scale F32[1], out_zp I32[1]

The op, its shape parameter (normalized_shape / num_groups) and eps are in the file's metadata as
"<case>" -> "op key=value ..."; the C++ test holds the same table and checks that the two agree.
Output parameters are the min / max of the fp32 op on the dequantized input (as an observer
would give), so the output codes span the range.
"""

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import torch_zoo  # noqa: E402  (the safetensors writer)

torch.backends.quantized.engine = "onednn"
torch.set_num_threads(1)
torch.manual_seed(20261125)

tensors = {}
meta = {}


def qparams_for(lo, hi):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / 255.0, 1e-8)
    zp = int(min(255, max(0, round(-lo / scale))))
    return float(torch.tensor(scale, dtype=torch.float32)), zp


def make_input(sizes, offset, spread):
    xf = torch.randn(*sizes) * spread + offset
    # A few rows with a constant or near-constant range exercise var ~ 0 (eps dominates).
    s, zp = qparams_for(float(xf.min()), float(xf.max()))
    return torch.quantize_per_tensor(xf, s, zp, torch.quint8)


def add_case(name, desc, qx, w, b, fp32_fn, q_fn):
    ref = fp32_fn(qx.dequantize())
    s, zp = qparams_for(float(ref.min()), float(ref.max()))
    out = q_fn(s, zp)
    tensors[f"{name}.x"] = qx.int_repr().contiguous()
    tensors[f"{name}.x_scale"] = torch.tensor([qx.q_scale()], dtype=torch.float32)
    tensors[f"{name}.x_zp"] = torch.tensor([qx.q_zero_point()], dtype=torch.int32)
    if w is not None:
        tensors[f"{name}.w"] = w.contiguous()
    if b is not None:
        tensors[f"{name}.b"] = b.contiguous()
    tensors[f"{name}.out"] = out.int_repr().contiguous()
    tensors[f"{name}.out_scale"] = torch.tensor([out.q_scale()], dtype=torch.float32)
    tensors[f"{name}.out_zp"] = torch.tensor([out.q_zero_point()], dtype=torch.int32)
    meta[name] = desc


def layer_norm_case(name, sizes, shape, eps, affine, offset=0.3, spread=1.5):
    qx = make_input(sizes, offset, spread)
    w = torch.randn(*shape) * 0.5 + 1.0 if affine else None
    b = torch.randn(*shape) * 0.3 if affine else None
    add_case(name, f"layer_norm normalized_shape={','.join(map(str, shape))} eps={eps!r}", qx, w, b,
             lambda xf: torch.nn.functional.layer_norm(xf, shape, w, b, eps),
             lambda s, zp: torch.ops.quantized.layer_norm(qx, shape, w, b, eps, s, zp))


def group_norm_case(name, sizes, groups, eps, affine, offset=-0.2, spread=2.0):
    qx = make_input(sizes, offset, spread)
    c = sizes[1]
    w = torch.randn(c) * 0.5 + 1.0 if affine else None
    b = torch.randn(c) * 0.3 if affine else None
    add_case(name, f"group_norm num_groups={groups} eps={eps!r}", qx, w, b,
             lambda xf: torch.nn.functional.group_norm(xf, groups, w, b, eps),
             lambda s, zp: torch.ops.quantized.group_norm(qx, groups, w, b, eps, s, zp))


def instance_norm_case(name, sizes, eps, affine, offset=0.5, spread=1.0):
    qx = make_input(sizes, offset, spread)
    c = sizes[1]
    w = torch.randn(c) * 0.5 + 1.0 if affine else None
    b = torch.randn(c) * 0.3 if affine else None
    add_case(name, f"instance_norm eps={eps!r}", qx, w, b,
             lambda xf: torch.nn.functional.instance_norm(xf, weight=w, bias=b, eps=eps),
             lambda s, zp: torch.ops.quantized.instance_norm(qx, w, b, eps, s, zp))


layer_norm_case("ln_affine", [3, 5, 64], [64], 1e-5, True)
layer_norm_case("ln_plain_tail", [2, 3, 37], [37], 1e-5, False)
layer_norm_case("ln_two_dims", [2, 6, 5], [6, 5], 1e-5, True)
layer_norm_case("ln_vit", [2, 17, 192], [192], 1e-6, True, offset=0.0, spread=3.0)
layer_norm_case("ln_bert", [1, 9, 200], [200], 1e-12, True, offset=1.0, spread=0.7)
layer_norm_case("ln_narrow_range", [4, 48], [48], 1e-5, True, offset=5.0, spread=0.05)
group_norm_case("gn_affine", [2, 8, 5, 5], 2, 1e-5, True)
group_norm_case("gn_plain_1d", [3, 6, 17], 3, 1e-5, False)
group_norm_case("gn_wide", [2, 32, 9, 9], 8, 1e-5, True)
group_norm_case("gn_one_group", [2, 4, 6, 6], 1, 1e-3, True)
instance_norm_case("in_affine_2d", [2, 4, 7, 7], 1e-5, True)
instance_norm_case("in_plain_1d", [1, 3, 40], 1e-5, False)
instance_norm_case("in_wide", [2, 3, 20, 20], 1e-5, True)

path = os.path.join(HERE, "golden", "int8_norms.safetensors")
torch_zoo.write_safetensors(path, sorted(tensors.items()),
                            dict(meta, generator="tests/int8/make_norm_goldens.py", torch=torch.__version__))
print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")
