#!/usr/bin/python3
"""Regenerates tests/ops/golden/ops.safetensors: inputs, weights and PyTorch reference outputs for
every eager op in runtime/ops.h, read by tests/ops/ops_golden_test.cc.

Run with Debian's python (PyTorch 1.13 from python3-torch), from the workspace root:

    /usr/bin/python3 tests/ops/make_op_goldens.py

Every case is named "<case>.<role>" (role: x, w, b, out, ...). Op parameters (stride, dims, ...)
live in both this script and the C++ test, next to the case name, so a reader sees them in one
place on each side. The file is written with a hand-rolled safetensors writer because Debian has no
`safetensors` package; the format is an 8-byte little-endian header length, a JSON header, and the
raw little-endian data.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torch_zoo  # noqa: E402  (the safetensors writer)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "ops.safetensors")

DTYPES = {
    torch.float32: "F32",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.int8: "I8",
}

tensors = {}


def put(name, t):
    assert name not in tensors, name
    t = t.detach()
    assert t.dtype in DTYPES, (name, t.dtype)
    tensors[name] = t.contiguous().clone()


def write_safetensors(path, named):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch_zoo.write_safetensors(path, sorted(named.items()),
                                {"generator": "tests/ops/make_op_goldens.py", "torch": torch.__version__})


def randn(*shape, scale=1.0):
    return torch.randn(shape) * scale


def away_from_zero(*shape):
    # Magnitudes in [0.5, 2] with random signs: safe divisors.
    mag = torch.rand(shape) * 1.5 + 0.5
    sign = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
    return mag * sign


# ---- conv2d ----------------------------------------------------------------------------------
# name: (x shape, w shape, bias?, stride, padding, dilation, groups)
CONV_CASES = {
    "conv_basic": ((2, 4, 9, 9), (6, 4, 3, 3), True, (1, 1), (1, 1), (1, 1), 1),
    "conv_stride2_pad1": ((1, 3, 10, 10), (5, 3, 3, 3), True, (2, 2), (1, 1), (1, 1), 1),
    "conv_nobias": ((1, 4, 8, 8), (4, 4, 3, 3), False, (1, 1), (0, 0), (1, 1), 1),
    "conv_dilation2": ((1, 3, 12, 12), (4, 3, 3, 3), True, (1, 1), (2, 2), (2, 2), 1),
    "conv_asymmetric": ((1, 3, 11, 13), (4, 3, 3, 5), True, (2, 1), (1, 0), (1, 2), 1),
    "conv_groups2": ((1, 8, 7, 7), (6, 4, 3, 3), True, (1, 1), (1, 1), (1, 1), 2),
    "conv_depthwise": ((2, 6, 8, 8), (6, 1, 3, 3), True, (1, 1), (1, 1), (1, 1), 6),
    "conv_depthwise_mult2_s2": ((1, 4, 9, 9), (8, 1, 3, 3), False, (2, 2), (1, 1), (1, 1), 4),
    "conv_1x1": ((2, 8, 5, 5), (16, 8, 1, 1), True, (1, 1), (0, 0), (1, 1), 1),
    "conv_7x7_s2": ((1, 3, 32, 32), (8, 3, 7, 7), False, (2, 2), (3, 3), (1, 1), 1),
    "conv_nonsquare": ((1, 3, 9, 14), (4, 3, 3, 3), True, (2, 2), (1, 1), (1, 1), 1),
}


def make_conv():
    for name, (xs, ws, has_b, stride, pad, dil, groups) in CONV_CASES.items():
        x, w = randn(*xs), randn(*ws, scale=0.3)
        b = randn(ws[0]) if has_b else None
        put(name + ".x", x)
        put(name + ".w", w)
        if has_b:
            put(name + ".b", b)
        put(name + ".out", F.conv2d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups))


# ---- linear / matmul -------------------------------------------------------------------------
def make_linear():
    for name, xs, (n, k), has_b in [
        ("linear_2d", (4, 10), (6, 10), True),
        ("linear_3d", (2, 3, 10), (5, 10), True),
        ("linear_nobias", (3, 7), (4, 7), False),
        ("linear_1d", (10,), (6, 10), True),
    ]:
        x, w = randn(*xs), randn(n, k, scale=0.3)
        b = randn(n) if has_b else None
        put(name + ".x", x)
        put(name + ".w", w)
        if has_b:
            put(name + ".b", b)
        put(name + ".out", F.linear(x, w, b))


def make_matmul():
    # name: (a shape, b shape); the "_kt" / "_at" cases store the operand untransposed and the
    # test transposes it into a strided view, as attention code does.
    for name, a_s, b_s in [
        ("mm_2d", (5, 7), (7, 3)),
        ("mm_3d", (2, 5, 7), (2, 7, 3)),
        ("mm_4d", (2, 3, 4, 5), (2, 3, 5, 6)),
        ("mm_bcast_batch", (2, 1, 4, 5), (3, 5, 6)),
        ("mm_3d_2d", (2, 4, 5), (5, 3)),
        ("mm_2d_3d", (4, 5), (2, 5, 3)),
        ("mm_1d_left", (5,), (2, 5, 3)),
        ("mm_1d_right", (2, 4, 5), (5,)),
        ("mm_1d_1d", (5,), (5,)),
        ("mm_2d_1d", (3, 5), (5,)),
        ("mm_1d_2d", (5,), (5, 3)),
    ]:
        a, b = randn(*a_s), randn(*b_s)
        put(name + ".a", a)
        put(name + ".b", b)
        put(name + ".out", torch.matmul(a, b))
    q, k = randn(2, 3, 4, 8), randn(2, 3, 6, 8)
    put("mm_kt.a", q)
    put("mm_kt.b", k)
    put("mm_kt.out", torch.matmul(q, k.transpose(-2, -1)))
    a, b = randn(2, 7, 5), randn(2, 7, 3)
    put("mm_at.a", a)
    put("mm_at.b", b)
    put("mm_at.out", torch.matmul(a.transpose(-2, -1), b))


# ---- binary ----------------------------------------------------------------------------------
BINARY_CASES = {
    "bin_same": ((2, 3, 4), (2, 3, 4)),
    "bin_bcast_b": ((2, 3, 4, 5), (4, 1)),
    "bin_bcast_a": ((3, 1, 5), (2, 3, 4, 5)),
    "bin_bcast_both": ((2, 1, 5), (1, 4, 1)),
    "bin_channel": ((2, 3, 4, 4), (3, 1, 1)),
    "bin_channel_first": ((3, 1, 1), (2, 3, 4, 4)),
    "bin_0d": ((2, 3), ()),
}
SCALAR = 2.5


def make_binary():
    for name, (a_s, b_s) in BINARY_CASES.items():
        a, b = randn(*a_s), away_from_zero(*b_s)
        put(name + ".a", a)
        put(name + ".b", b)
        put(name + ".add", a + b)
        put(name + ".sub", a - b)
        put(name + ".mul", a * b)
        put(name + ".div", a / b)
    x = away_from_zero(3, 4)
    put("scalar.x", x)
    put("scalar.add", x + SCALAR)
    put("scalar.radd", SCALAR + x)
    put("scalar.sub", x - SCALAR)
    put("scalar.rsub", SCALAR - x)
    put("scalar.mul", x * -SCALAR)
    put("scalar.rmul", -SCALAR * x)
    put("scalar.div", x / SCALAR)
    put("scalar.rdiv", SCALAR / x)
    put("scalar.neg", -x)


# ---- unary activations -----------------------------------------------------------------------
def make_unary():
    x = randn(2, 3, 5, 4, scale=4.0)  # wide enough to hit every saturation point (relu6, hardswish)
    put("unary.x", x)
    put("unary.relu", F.relu(x))
    put("unary.relu6", F.relu6(x))
    put("unary.hardtanh_default", F.hardtanh(x))
    put("unary.hardtanh", F.hardtanh(x, -0.5, 0.8))
    put("unary.leaky_relu_default", F.leaky_relu(x))
    put("unary.leaky_relu", F.leaky_relu(x, 0.2))
    put("unary.sigmoid", torch.sigmoid(x))
    put("unary.tanh", torch.tanh(x))
    put("unary.hardsigmoid", F.hardsigmoid(x))
    put("unary.hardswish", F.hardswish(x))
    put("unary.silu", F.silu(x))
    put("unary.gelu", F.gelu(x))
    put("unary.gelu_tanh", F.gelu(x, approximate="tanh"))
    put("unary.clamp", torch.clamp(x, -1.2, 0.7))
    put("unary.elu", F.elu(x))
    put("unary.elu_alpha", F.elu(x, 0.5))


def make_softmax():
    x = randn(2, 3, 4, 5, scale=2.0)
    put("softmax.x", x)
    for d in (0, 1, 2, -1):
        tag = str(d).replace("-", "m")
        put("softmax.dim" + tag, F.softmax(x, d))
        put("log_softmax.dim" + tag, F.log_softmax(x, d))
    x2 = randn(4, 10, scale=3.0)
    put("softmax2d.x", x2)
    put("softmax2d.out", F.softmax(x2, 1))
    put("softmax2d.log", F.log_softmax(x2, 1))
    x1 = randn(7, scale=3.0)
    put("softmax1d.x", x1)
    put("softmax1d.out", F.softmax(x1, 0))
    put("softmax1d.log", F.log_softmax(x1, 0))


# ---- normalization ---------------------------------------------------------------------------
def make_layer_norm():
    # name: (x shape, normalized_shape, weight?, bias?, eps)
    for name, xs, ns, has_w, has_b, eps in [
        ("ln_affine_1d", (2, 5, 8), (8,), True, True, 1e-5),
        ("ln_plain_1d", (3, 6), (6,), False, False, 1e-5),
        ("ln_affine_2d", (2, 3, 4, 5), (4, 5), True, True, 1e-5),
        ("ln_plain_2d", (2, 4, 6), (4, 6), False, False, 1e-3),
        ("ln_weight_only", (2, 7), (7,), True, False, 1e-5),
    ]:
        x = randn(*xs, scale=2.0) + 1.0
        w = randn(*ns) if has_w else None
        b = randn(*ns) if has_b else None
        put(name + ".x", x)
        if has_w:
            put(name + ".w", w)
        if has_b:
            put(name + ".b", b)
        put(name + ".out", F.layer_norm(x, ns, w, b, eps))


def make_batch_norm():
    for name, xs, affine, eps in [
        ("bn_4d", (2, 4, 5, 5), True, 1e-5),
        ("bn_2d", (6, 5), True, 1e-5),
        ("bn_plain", (2, 3, 4, 4), False, 1e-3),
    ]:
        c = xs[1]
        x = randn(*xs, scale=2.0)
        mean, var = randn(c), torch.rand(c) * 2 + 0.1
        w = randn(c) if affine else None
        b = randn(c) if affine else None
        put(name + ".x", x)
        put(name + ".mean", mean)
        put(name + ".var", var)
        if affine:
            put(name + ".w", w)
            put(name + ".b", b)
        put(name + ".out", F.batch_norm(x, mean, var, w, b, training=False, eps=eps))


# ---- pooling ---------------------------------------------------------------------------------
# name: (x shape, kernel, stride, padding, dilation, ceil_mode)
MAX_POOL_CASES = {
    "mp_k2": ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),
    "mp_k3s2p1": ((1, 4, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1), False),
    "mp_ceil": ((1, 2, 10, 11), (3, 3), (2, 2), (0, 0), (1, 1), True),
    "mp_ceil_pad": ((1, 2, 7, 7), (2, 2), (2, 2), (1, 1), (1, 1), True),
    "mp_dilation": ((1, 2, 9, 10), (3, 3), (1, 1), (1, 1), (2, 2), False),
    "mp_asymmetric": ((1, 3, 8, 9), (2, 3), (2, 1), (1, 1), (1, 1), False),
}
# name: (x shape, kernel, stride, padding, ceil_mode, count_include_pad)
AVG_POOL_CASES = {
    "ap_k2": ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False, True),
    "ap_k3s2p1_incl": ((1, 4, 9, 9), (3, 3), (2, 2), (1, 1), False, True),
    "ap_k3s2p1_excl": ((1, 4, 9, 9), (3, 3), (2, 2), (1, 1), False, False),
    "ap_ceil_incl": ((1, 2, 10, 11), (3, 3), (2, 2), (0, 0), True, True),
    "ap_ceil_excl": ((1, 2, 10, 11), (3, 3), (2, 2), (0, 0), True, False),
    "ap_ceil_pad_incl": ((1, 2, 8, 8), (3, 3), (2, 2), (1, 1), True, True),
    "ap_asymmetric": ((1, 3, 8, 9), (2, 3), (2, 1), (1, 1), False, True),
}
# name: (x shape, output size)
ADAPTIVE_CASES = {
    "aap_1x1": ((2, 3, 7, 7), (1, 1)),
    "aap_divisible": ((1, 3, 8, 6), (4, 3)),
    "aap_nondivisible": ((1, 3, 7, 10), (3, 4)),
    "aap_upsample": ((1, 2, 3, 3), (5, 4)),
}


def make_pool():
    for name, (xs, k, s, p, d, ceil) in MAX_POOL_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.max_pool2d(x, k, s, p, d, ceil_mode=ceil))
    for name, (xs, k, s, p, ceil, incl) in AVG_POOL_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=incl))
    for name, (xs, o) in ADAPTIVE_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.adaptive_avg_pool2d(x, o))


# ---- joining, shape, reductions, embedding ---------------------------------------------------
def make_cat():
    for name, shapes, dim in [
        ("cat_dim0", [(2, 3), (1, 3), (4, 3)], 0),
        ("cat_dim1", [(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1),
        ("cat_last", [(2, 3), (2, 2)], -1),
        ("cat_channels", [(1, 2, 3, 3), (1, 4, 3, 3), (1, 1, 3, 3)], 1),
        ("cat_spatial", [(1, 2, 3, 3), (1, 2, 2, 3)], 2),
        ("cat_with_empty", [(2, 0), (2, 3), (2, 0)], 1),
    ]:
        ts = [randn(*s) for s in shapes]
        for i, t in enumerate(ts):
            put("%s.in%d" % (name, i), t)
        put(name + ".out", torch.cat(ts, dim))


def make_flatten():
    x = randn(2, 3, 4, 5)
    put("flatten.x", x)
    put("flatten.from1", torch.flatten(x, 1))
    put("flatten.all", torch.flatten(x))
    put("flatten.0to2", torch.flatten(x, 0, 2))
    put("flatten.last2", torch.flatten(x, -2, -1))


def make_reductions():
    x = randn(2, 3, 4, 5, scale=2.0) + 0.5
    put("reduce.x", x)
    for dims, keep, tag in [((1,), False, "d1"), ((2, 3), True, "d23_keep"), ((), False, "all"),
                            ((-1,), False, "dm1"), ((0, 2), False, "d02")]:
        if dims:
            put("mean." + tag, torch.mean(x, dims, keepdim=keep))
            put("sum." + tag, torch.sum(x, dims, keepdim=keep))
            put("std." + tag, torch.std(x, dims, unbiased=True, keepdim=keep))
        else:
            put("mean." + tag, torch.mean(x))
            put("sum." + tag, torch.sum(x))
            put("std." + tag, torch.std(x))
    put("std.d1_biased", torch.std(x, (1,), unbiased=False))


def make_embedding():
    w = randn(10, 4)
    idx2 = torch.tensor([[0, 3, 9], [3, 3, 1]], dtype=torch.int64)
    idx1 = torch.tensor([7, 0, 2, 2], dtype=torch.int64)
    put("embedding.w", w)
    put("embedding.idx2", idx2)
    put("embedding.idx1", idx1)
    put("embedding.out2", F.embedding(idx2, w))
    put("embedding.out1", F.embedding(idx1, w))


# ---- quantization ----------------------------------------------------------------------------
def f32(v):
    # A Python float that is exactly a float32, so PyTorch (which keeps scales as double) and dbrq
    # (float) quantize with the same scale.
    return float(torch.tensor(v, dtype=torch.float32).item())


def make_quant():
    # name: (x, scale, zero_point, dtype)
    ties = torch.arange(-40, 40, dtype=torch.float32) * 0.0625  # x / 0.125 lands on k + 0.5: round half to even
    big = torch.tensor([-1e12, -3e9, -1e6, -300.0, -2.5, 0.0, 2.5, 300.0, 1e6, 3e9, 1e12])
    for name, x, scale, zp, dtype in [
        ("q_u8", randn(4, 5, 6, scale=2.0), 0.03, 128, torch.quint8),
        ("q_s8", randn(4, 5, 6, scale=2.0), 0.02, -5, torch.qint8),
        ("q_u8_ties", ties, 0.125, 3, torch.quint8),
        ("q_s8_ties", ties, 0.125, 0, torch.qint8),
        ("q_u8_saturate", big, 0.01, 10, torch.quint8),
        ("q_s8_saturate", big, 0.01, 0, torch.qint8),
        ("q_u8_4d", randn(2, 3, 4, 5), 0.017, 100, torch.quint8),
    ]:
        scale = f32(scale)
        q = torch.quantize_per_tensor(x, scale, zp, dtype)
        put(name + ".x", x)
        put(name + ".scale", torch.tensor([scale], dtype=torch.float32))
        put(name + ".zero_point", torch.tensor([zp], dtype=torch.int32))
        put(name + ".q", q.int_repr())
        put(name + ".dq", q.dequantize())
    # name: (x shape, axis, symmetric?, dtype)
    for name, xs, axis, symmetric, dtype in [
        ("qpc_s8_axis0", (6, 3, 3, 3), 0, True, torch.qint8),
        ("qpc_s8_axis1", (2, 4, 5), 1, False, torch.qint8),
        ("qpc_u8_axis1", (2, 4, 3, 3), 1, False, torch.quint8),
        ("qpc_s8_axis_last", (3, 5), 1, True, torch.qint8),
    ]:
        x = randn(*xs, scale=1.5)
        c = xs[axis]
        scales = (torch.rand(c) * 0.045 + 0.005).to(torch.float32)
        if symmetric:
            zps = torch.zeros(c, dtype=torch.int64)
        elif dtype == torch.quint8:
            zps = torch.randint(100, 150, (c,), dtype=torch.int64)
        else:
            zps = torch.randint(-3, 4, (c,), dtype=torch.int64)
        q = torch.quantize_per_channel(x, scales.to(torch.float64), zps, axis, dtype)
        put(name + ".x", x)
        put(name + ".scales", scales)
        put(name + ".zero_points", zps.to(torch.int32))
        put(name + ".q", q.int_repr())
        put(name + ".dq", q.dequantize())


# ---- issue 12 op families (appended: every earlier case keeps its random data) -----------------
def make_shape_families():
    a, b, c = randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4)
    put("stack.a", a)
    put("stack.b", b)
    put("stack.c", c)
    for d in (0, 1, 3, -1, -4):
        put("stack.d%s" % str(d).replace("-", "m"), torch.stack([a, b, c], d))
    x4 = randn(2, 3, 5, 4)
    put("stack4.x", x4)
    put("stack4.out", torch.stack([x4, x4 * 2.0], 2))

    s = randn(1, 3, 1, 4, 1)
    put("squeeze.x", s)
    put("squeeze.all", torch.squeeze(s))
    put("squeeze.d2", torch.squeeze(s, 2))
    put("squeeze.d1", torch.squeeze(s, 1))  # not size 1: unchanged
    put("unsqueeze.d0", torch.unsqueeze(s, 0))
    put("unsqueeze.dm1", torch.unsqueeze(s, -1))

    e = randn(3, 1, 4)
    put("expand.x", e)
    put("expand.same", e.expand(3, 5, 4))
    put("expand.lead", e.expand(2, 3, 5, -1))
    put("expand.relu", torch.relu(e.expand(2, 3, 5, 4)))
    put("expand.add", e.expand(3, 5, 4) + randn(3, 5, 4))

    r = randn(2, 3, 2)
    put("repeat.x", r)
    put("repeat.same", r.repeat(2, 1, 3))
    put("repeat.lead", r.repeat(2, 1, 2, 1))
    put("repeat.zero", r.repeat(1, 0, 1))

    p = randn(2, 3, 5, 6)
    put("pad.x", p)
    put("pad.const_last", F.pad(p, (1, 2)))
    put("pad.const_2d", F.pad(p, (1, 2, 3, 0), value=0.75))
    put("pad.const_4d", F.pad(p, (1, 0, 0, 1, 2, 1, 1, 1), value=-1.5))
    put("pad.const_neg", F.pad(p, (-1, 2, 1, -2)))
    put("pad.reflect_2d", F.pad(p, (2, 1, 3, 4), mode="reflect"))
    put("pad.replicate_2d", F.pad(p, (2, 1, 3, 4), mode="replicate"))
    p3 = randn(2, 4, 7)
    put("pad.x3", p3)
    put("pad.reflect_1d", F.pad(p3, (3, 2), mode="reflect"))
    put("pad.replicate_1d", F.pad(p3, (0, 5), mode="replicate"))
    p5 = randn(1, 2, 3, 4, 5)
    put("pad.x5", p5)
    put("pad.reflect_3d", F.pad(p5, (1, 2, 2, 1, 1, 1), mode="reflect"))
    put("pad.replicate_3d", F.pad(p5, (1, 2, 2, 1, 1, 1), mode="replicate"))


def make_activation_families():
    x = randn(2, 3, 5, 4, scale=3.0)
    put("act12.x", x)
    w3 = torch.tensor([0.25, -0.5, 1.5])
    put("prelu.w3", w3)
    put("prelu.per_channel", F.prelu(x, w3))
    put("prelu.one", F.prelu(x, torch.tensor([0.1])))
    x2 = randn(6, 3, scale=2.0)
    put("prelu.x2", x2)
    put("prelu.out2", F.prelu(x2, w3))
    put("softplus.default", F.softplus(x))
    put("softplus.beta2", F.softplus(x, beta=2.0, threshold=5.0))
    put("softplus.beta_half", F.softplus(x, beta=0.5, threshold=1.0))
    put("mish.out", F.mish(x))
    # Far tails: softplus's threshold switch and mish's saturation.
    t = torch.linspace(-30.0, 30.0, 121)
    put("act12.tails", t)
    put("softplus.tails", F.softplus(t))
    put("mish.tails", F.mish(t))


def make_math_families():
    a, b = randn(2, 3, 4), randn(3, 1)
    mask = (torch.rand(2, 1, 4) < 0.5).to(torch.uint8)
    put("where.a", a)
    put("where.b", b)
    put("where.mask", mask)
    put("where.out", torch.where(mask.bool(), a, b))
    put("where.scalar_other", torch.where(mask.bool(), a, torch.tensor(-2.5)))
    put("where.scalar_input", torch.where(mask.bool(), torch.tensor(0.75), a))
    x = torch.rand(2, 3, 4) * 3.0 + 0.1  # positive: fractional powers
    e = randn(3, 4)
    put("pow.x", x)
    put("pow.e", e)
    put("pow.sq", torch.pow(x, 2.0))
    put("pow.half", torch.pow(x, 0.5))
    put("pow.neg", torch.pow(x, -1.5))
    put("pow.tensor", torch.pow(x, e))
    put("pow.base", torch.pow(2.0, e))
    s = randn(2, 3, 4)
    put("pow.signed", s)
    put("pow.signed_cube", torch.pow(s, 3.0))
    put("sqrt.out", torch.sqrt(x))
    put("exp.x", s)
    put("exp.out", torch.exp(s))


def make_indexing_families():
    x = randn(3, 5, 4)
    put("idx.x", x)
    v, i = torch.max(x, 1)
    put("max.d1.values", v)
    put("max.d1.indices", i)
    v, i = torch.max(x, -1, keepdim=True)
    put("max.dm1k.values", v)
    put("max.dm1k.indices", i)
    put("argmax.d0", torch.argmax(x, 0))
    put("argmax.d2k", torch.argmax(x, 2, keepdim=True))
    v, i = torch.topk(x, 3, 1)
    put("topk.k3d1.values", v)
    put("topk.k3d1.indices", i)
    v, i = torch.topk(x, 2, -1, largest=False)
    put("topk.k2small.values", v)
    put("topk.k2small.indices", i)
    sel = torch.tensor([4, 0, 2, 2], dtype=torch.int64)
    put("index_select.index", sel)
    put("index_select.d1", torch.index_select(x, 1, sel))
    put("index_select.d2", torch.index_select(x, 2, torch.tensor([3, 1], dtype=torch.int64)))
    gi = torch.randint(0, 5, (3, 2, 4), dtype=torch.int64)
    put("gather.index", gi)
    put("gather.d1", torch.gather(x, 1, gi))
    gi0 = torch.randint(0, 3, (2, 5, 3), dtype=torch.int64)
    put("gather.index0", gi0)
    put("gather.d0", torch.gather(x, 0, gi0))
# ---- issue 12 spatial ops (appended: earlier goldens stay byte-identical) ----------------------
# name: (x shape, w shape [in, out/groups, kH, kW], bias?, stride, padding, output_padding, dilation, groups)
CONVT_CASES = {
    "convt_basic": ((2, 4, 5, 5), (4, 6, 3, 3), True, (1, 1), (0, 0), (0, 0), (1, 1), 1),
    "convt_s2_p1_op1": ((1, 4, 5, 6), (4, 3, 3, 3), True, (2, 2), (1, 1), (1, 1), (1, 1), 1),
    "convt_s2_p0_op1": ((1, 3, 4, 4), (3, 4, 3, 3), True, (2, 2), (0, 0), (1, 1), (1, 1), 1),
    "convt_dcgan_k4_s2_p1": ((2, 8, 4, 4), (8, 4, 4, 4), False, (2, 2), (1, 1), (0, 0), (1, 1), 1),
    "convt_groups2": ((1, 4, 5, 5), (4, 3, 3, 3), True, (1, 1), (1, 1), (0, 0), (1, 1), 2),
    "convt_dilation2": ((1, 3, 5, 5), (3, 2, 3, 3), True, (1, 1), (1, 1), (0, 0), (2, 2), 1),
    "convt_asymmetric": ((1, 3, 4, 5), (3, 5, 3, 2), True, (2, 1), (1, 0), (1, 0), (1, 2), 1),
}


def make_conv_transpose():
    for name, (xs, ws, has_b, stride, pad, out_pad, dil, groups) in CONVT_CASES.items():
        x, w = randn(*xs), randn(*ws, scale=0.3)
        b = randn(ws[1] * groups) if has_b else None
        put(name + ".x", x)
        put(name + ".w", w)
        if has_b:
            put(name + ".b", b)
        put(name + ".out", F.conv_transpose2d(x, w, b, stride=stride, padding=pad, output_padding=out_pad,
                                              groups=groups, dilation=dil))


# name: (x shape, w shape [out, in/groups, kL], bias?, stride, padding, dilation, groups)
CONV1D_CASES = {
    "c1d_basic": ((2, 4, 10), (6, 4, 3), True, 1, 1, 1, 1),
    "c1d_s2_d2": ((1, 4, 12), (5, 4, 3), True, 2, 2, 2, 1),
    "c1d_groups2": ((1, 6, 9), (6, 3, 3), True, 1, 0, 1, 2),
    "c1d_depthwise_nobias": ((2, 4, 8), (8, 1, 5), False, 1, 2, 1, 4),
}
# name: (x shape, kernel, stride, padding, dilation, ceil_mode)
MAXPOOL1D_CASES = {
    "mp1d_k3_s2_p1": ((2, 3, 11), 3, 2, 1, 1, False),
    "mp1d_ceil_dil2": ((1, 4, 12), 3, 2, 0, 2, True),
}
# name: (x shape, kernel, stride, padding, ceil_mode, count_include_pad)
AVGPOOL1D_CASES = {
    "ap1d_k3_s2_p1": ((2, 3, 11), 3, 2, 1, False, True),
    "ap1d_ceil_nocount": ((1, 4, 10), 4, 3, 2, True, False),
}
# name: (x shape, output size)
ADAPTIVE1D_CASES = {"aap1d_4": ((2, 3, 10), 4), "aap1d_3_from_11": ((1, 5, 11), 3)}


def make_conv1d_pool1d():
    for name, (xs, ws, has_b, stride, pad, dil, groups) in CONV1D_CASES.items():
        x, w = randn(*xs), randn(*ws, scale=0.3)
        b = randn(ws[0]) if has_b else None
        put(name + ".x", x)
        put(name + ".w", w)
        if has_b:
            put(name + ".b", b)
        put(name + ".out", F.conv1d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups))
    for name, (xs, k, s, p, d, ceil) in MAXPOOL1D_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.max_pool1d(x, k, s, p, d, ceil_mode=ceil))
    for name, (xs, k, s, p, ceil, count) in AVGPOOL1D_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.avg_pool1d(x, k, s, p, ceil_mode=ceil, count_include_pad=count))
    for name, (xs, o) in ADAPTIVE1D_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.adaptive_avg_pool1d(x, o))


# name: (x shape, size, scale_factor, mode, align_corners)
INTERP_CASES = {
    "interp_nearest_s2": ((1, 3, 4, 5), None, (2.0, 2.0), "nearest", None),
    "interp_nearest_size": ((2, 2, 5, 4), (7, 9), None, "nearest", None),
    "interp_nearest_s1_5_2_5": ((1, 2, 4, 6), None, (1.5, 2.5), "nearest", None),
    "interp_bilinear_s2": ((1, 3, 4, 5), None, (2.0, 2.0), "bilinear", False),
    "interp_bilinear_ac_size": ((1, 3, 4, 5), (9, 7), None, "bilinear", True),
    "interp_bilinear_down": ((2, 2, 8, 6), (5, 4), None, "bilinear", False),
    "interp_bilinear_s1_7_1_3": ((1, 2, 5, 5), None, (1.7, 1.3), "bilinear", False),
}


def make_interpolate():
    for name, (xs, size, scale, mode, ac) in INTERP_CASES.items():
        x = randn(*xs)
        put(name + ".x", x)
        put(name + ".out", F.interpolate(x, size=size, scale_factor=scale, mode=mode, align_corners=ac))


# name: (x shape, num_groups, affine?, eps)
GROUP_NORM_CASES = {
    "gn_4d_g2": ((2, 6, 5, 4), 2, True, 1e-5),
    "gn_3d_g3_noaffine": ((2, 6, 7), 3, False, 1e-5),
    "gn_per_channel_eps": ((1, 4, 3, 3), 4, True, 1e-3),
}
# name: (x shape, affine?)
INSTANCE_NORM_CASES = {"in_4d": ((2, 3, 6, 5), False), "in_4d_affine": ((2, 4, 5, 5), True)}


def make_group_norms():
    for name, (xs, g, affine, eps) in GROUP_NORM_CASES.items():
        x = randn(*xs, scale=2.0) + 0.5
        w = randn(xs[1]) if affine else None
        b = randn(xs[1]) if affine else None
        put(name + ".x", x)
        if affine:
            put(name + ".w", w)
            put(name + ".b", b)
        put(name + ".out", F.group_norm(x, g, w, b, eps))
    for name, (xs, affine) in INSTANCE_NORM_CASES.items():
        x = randn(*xs, scale=2.0) - 0.3
        w = randn(xs[1]) if affine else None
        b = randn(xs[1]) if affine else None
        put(name + ".x", x)
        if affine:
            put(name + ".w", w)
            put(name + ".b", b)
        put(name + ".out", F.instance_norm(x, weight=w, bias=b))


def main():
    torch.manual_seed(20240611)
    torch.set_num_threads(1)
    make_conv()
    make_linear()
    make_matmul()
    make_binary()
    make_unary()
    make_softmax()
    make_layer_norm()
    make_batch_norm()
    make_pool()
    make_cat()
    make_flatten()
    make_reductions()
    make_embedding()
    make_quant()
    make_shape_families()
    make_activation_families()
    make_math_families()
    make_indexing_families()
    make_conv_transpose()
    make_conv1d_pool1d()
    make_interpolate()
    make_group_norms()
    write_safetensors(OUT_PATH, tensors)
    size = os.path.getsize(OUT_PATH)
    print("wrote %d tensors, %d bytes to %s" % (len(tensors), size, OUT_PATH))
    if size > 1 << 20:
        sys.exit("golden file is over 1 MB; shrink the cases")


if __name__ == "__main__":
    main()
