#!/usr/bin/python3
"""Regenerates the int8 goldens in tests/int8/golden/, read by int8_ops_golden_test.cc and
int8_e2e_test.cc.

Run with Debian's interpreter (python3-torch 1.13, python3-torchvision 0.14), from anywhere:

    /usr/bin/python3 tests/int8/make_int8_goldens.py

Everything is seeded; rerunning rewrites identical files.

int8_ops.safetensors -- one case per quantized op, computed by PyTorch 1.13 with
torch.backends.quantized.engine = 'onednn' on exactly the codes and quantization parameters dbrq's
kernels get in the test. Tensors are named "<case>.<role>":

    x, y (,...)      u8 input codes                          x_scale/x_zp, y_scale/y_zp: F32[1], I32[1]
    w, b             f32 weights and bias (PyTorch quantizes w itself with the weight qparams)
    w_scales, w_zps  the weight qparams PyTorch used (F32[K] / I32[K]; [1] for per-tensor)
    wq               PyTorch's int8 weight codes (I8), to check dbrq's weight quantization too
    out              PyTorch's output codes (int_repr(), U8), in NCHW (logical) order
    out_scale/out_zp the output qparams (given to PyTorch, or chosen by it for fixed-qparams ops)
    xf, outf         f32 tensors for quantize_per_tensor / dequantize

The op parameters (stride, padding, dims, ...) are written into the file's metadata as
"<case>" -> "op key=value ..." strings; the C++ test holds the same table and checks that the two
agree, so a reader sees every case's parameters next to its name on both sides.

Which PyTorch kernels these are (1.13, onednn engine):
    conv2d, linear           oneDNN (ideep) u8 x s8 primitives: the only ops that run on oneDNN
    add, add_relu, mul, cat, PyTorch's own quantized CPU kernels (Vectorized<quint8> + scalar
    pooling, relu/clamp,     tails); dbrq mirrors their arithmetic rather than calling oneDNN
    sigmoid, tanh, hardsigmoid, hardswish, leaky_relu, gelu, softmax, quantize / dequantize
    matmul                   PyTorch has no int8 matmul of two activations: the reference is its
                             FX lowering (dequantize, fp32 matmul, quantize)

e2e_small_cnn.safetensors and e2e_resnet18.safetensors -- end-to-end references from PyTorch FX
(prepare_fx / convert_fx, onednn engine) for the zoo's SmallCnn and tiny ResNet-18 (samples/zoo),
with the same module tree and state-dict keys as the C++ models:

    every state-dict tensor (weights stored as F16: values rounded to half precision before use, so
    the file is half the size while both sides see exactly the same f32 numbers)
    calib_codes  U8 calibration images; the model input is (code - 128) / 32 (exact in f32)
    eval_codes   U8 evaluation images, same encoding
    fp32_logits  the fp32 model's logits on the evaluation images
    fx_codes     U8 logits of the converted FX model (the last quantized op's int_repr(), before
                 the final dequantize), with fx_scale / fx_zp
    fx_qparams.<tensor> F32[2] (scale, zero point) of every quantized activation in FX's graph
    metadata: the FX graph of the converted model and the observer configuration.

SmallCnn uses MinMaxObserver (u8, per-tensor affine) for activations and PerChannelMinMaxObserver
(s8, per-channel symmetric) for weights, so the qparams are deterministic functions of the data.
ResNet-18 uses get_default_qconfig_mapping('onednn') (HistogramObserver, per-channel weights).
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torch.nn.intrinsic.quantized as nniq  # 1.13 has no torch.ao.nn.intrinsic.quantized yet
import torch.ao.nn.quantized as nnq
from torch.ao.quantization import (MinMaxObserver, PerChannelMinMaxObserver, QConfig, QConfigMapping,
                                   get_default_qconfig_mapping)
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(HERE, "golden")
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import torch_zoo  # noqa: E402  (the safetensors writer and the zoo's PyTorch twins)

DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.int8: "I8",
}

torch.backends.quantized.engine = "onednn"
torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# safetensors files (tools/torch_zoo.py writes the format; Debian has no safetensors package)


def write_safetensors(path, named, metadata):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch_zoo.write_safetensors(path, sorted(named.items()),
                                dict(metadata, generator="tests/int8/make_int8_goldens.py", torch=torch.__version__))
    print(f"wrote {path}: {len(named)} tensors, {os.path.getsize(path)} bytes")


# ---------------------------------------------------------------------------------------------
# per-op goldens

tensors = {}
meta = {}


def put(name, t):
    assert name not in tensors, name
    tensors[name] = t.detach().contiguous().clone()


def f32(v):
    """v rounded to float32 (PyTorch keeps scales as doubles; dbrq as floats: use f32 values)."""
    return float(torch.tensor(v, dtype=torch.float32))


def put_qparams(case, role, scale, zp):
    put(f"{case}.{role}_scale", torch.tensor([scale], dtype=torch.float32))
    put(f"{case}.{role}_zp", torch.tensor([zp], dtype=torch.int32))


def minmax_qparams(t):
    """PyTorch's MinMaxObserver (u8, per-tensor affine) over a float tensor."""
    obs = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
    obs(t)
    s, z = obs.calculate_qparams()
    return float(s), int(z)


def rand_codes(shape, lo=0, hi=255, memory_format=torch.contiguous_format):
    return torch.randint(lo, hi + 1, shape, dtype=torch.uint8).contiguous(memory_format=memory_format)


def all_codes(shape):
    """Every code 0..255 equally often, shuffled: LUT-style ops get every table entry checked."""
    n = 1
    for d in shape:
        n *= d
    assert n % 256 == 0
    codes = torch.arange(256, dtype=torch.int64).repeat(n // 256)
    return codes[torch.randperm(n)].to(torch.uint8).reshape(shape)


def qtensor(codes, scale, zp):
    """A quint8 tensor with these codes (keeps codes' memory format)."""
    return torch._make_per_tensor_quantized_tensor(codes, scale, zp)


def put_input(case, role, codes, scale, zp):
    put(f"{case}.{role}", codes)
    put_qparams(case, role, scale, zp)
    return qtensor(codes, scale, zp)


def put_output(case, qy):
    put(f"{case}.out", qy.int_repr())
    put_qparams(case, "out", qy.q_scale(), qy.q_zero_point())


def weight_qparams(w, per_channel):
    if per_channel:
        obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    else:
        obs = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    obs(w)
    s, z = obs.calculate_qparams()
    s = s.to(torch.float32).reshape(-1)
    z = z.to(torch.int32).reshape(-1)
    if per_channel:
        wq = torch.quantize_per_channel(w, s.double(), z.long(), 0, torch.qint8)
    else:
        wq = torch.quantize_per_tensor(w, float(s[0]), int(z[0]), torch.qint8)
    return s, z, wq


def conv_case(case, n, c, k, hw, kernel, stride=1, padding=0, dilation=1, groups=1, bias=True, relu=False,
              per_channel=True, x_zp=None, x_scale=0.02, then_relu6=False):
    """then_relu6: PyTorch's conv followed by its quantized relu6 (dbrq can fuse the clip instead)."""
    h, w_ = hw
    x_zp = int(torch.randint(0, 256, (1,))) if x_zp is None else x_zp
    x_scale = f32(x_scale)
    codes = rand_codes((n, c, h, w_))
    qx = put_input(case, "x", codes, x_scale, x_zp)
    w = torch.randn(k, c // groups, kernel, kernel) * (1.0 / (c // groups * kernel * kernel)) ** 0.5
    b = torch.randn(k) * 0.5 if bias else None
    ws, wz, wq = weight_qparams(w, per_channel)
    put(f"{case}.w", w)
    put(f"{case}.w_scales", ws)
    put(f"{case}.w_zps", wz)
    put(f"{case}.wq", wq.int_repr())
    if bias:
        put(f"{case}.b", b)
    # Output qparams from the range of the real result (what an observer would choose).
    ref = F.conv2d(qx.dequantize(), wq.dequantize(), b, stride, padding, dilation, groups)
    if relu:
        ref = F.relu(ref)
    os_, oz = minmax_qparams(ref)
    cls = nniq.ConvReLU2d if relu else nnq.Conv2d
    m = cls(c, k, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    m.set_weight_bias(wq, b)
    m.scale = os_
    m.zero_point = oz
    qy = m(qx)
    if then_relu6:
        qy = F.relu6(qy)
    put_output(case, qy)
    meta[case] = (f"conv2d kernel={kernel} stride={stride} padding={padding} dilation={dilation} groups={groups} "
                  f"bias={int(bias)} relu={int(relu)} per_channel={int(per_channel)} relu6={int(then_relu6)}")


def convt_case(case, n, c, k, hw, kernel, stride=1, padding=0, dilation=1, groups=1, bias=True, x_zp=None,
               x_scale=0.02):
    """quantized::conv_transpose2d with per-tensor weights; w in PyTorch's [c, k/groups, kH, kW]."""
    h, w_ = hw
    x_zp = int(torch.randint(0, 256, (1,))) if x_zp is None else x_zp
    x_scale = f32(x_scale)
    qx = put_input(case, "x", rand_codes((n, c, h, w_)), x_scale, x_zp)
    w = torch.randn(c, k // groups, kernel, kernel) * (1.0 / (c // groups * kernel * kernel)) ** 0.5
    b = torch.randn(k) * 0.5 if bias else None
    ws, wz, wq = weight_qparams(w, False)
    put(f"{case}.w", w)
    put(f"{case}.w_scales", ws)
    put(f"{case}.w_zps", wz)
    put(f"{case}.wq", wq.int_repr())
    if bias:
        put(f"{case}.b", b)
    ref = F.conv_transpose2d(qx.dequantize(), wq.dequantize(), b, stride, padding, 0, groups, dilation)
    os_, oz = minmax_qparams(ref)
    packed = torch.ops.quantized.conv_transpose2d_prepack(wq, b, [stride] * 2, [padding] * 2, [0, 0],
                                                          [dilation] * 2, groups)
    put_output(case, torch.ops.quantized.conv_transpose2d(qx, packed, os_, oz))
    meta[case] = (f"conv_transpose2d kernel={kernel} stride={stride} padding={padding} dilation={dilation} "
                  f"groups={groups} bias={int(bias)}")


def conv1d_case(case, n, c, k, length, kernel, stride=1, padding=0, dilation=1, groups=1, bias=True, relu=False,
                per_channel=True, x_zp=None, x_scale=0.02):
    x_zp = int(torch.randint(0, 256, (1,))) if x_zp is None else x_zp
    x_scale = f32(x_scale)
    qx = put_input(case, "x", rand_codes((n, c, length)), x_scale, x_zp)
    w = torch.randn(k, c // groups, kernel) * (1.0 / (c // groups * kernel)) ** 0.5
    b = torch.randn(k) * 0.5 if bias else None
    ws, wz, wq = weight_qparams(w, per_channel)
    put(f"{case}.w", w)
    put(f"{case}.w_scales", ws)
    put(f"{case}.w_zps", wz)
    put(f"{case}.wq", wq.int_repr())
    if bias:
        put(f"{case}.b", b)
    ref = F.conv1d(qx.dequantize(), wq.dequantize(), b, stride, padding, dilation, groups)
    if relu:
        ref = F.relu(ref)
    os_, oz = minmax_qparams(ref)
    cls = nniq.ConvReLU1d if relu else nnq.Conv1d
    m = cls(c, k, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    m.set_weight_bias(wq, b)
    m.scale = os_
    m.zero_point = oz
    put_output(case, m(qx))
    meta[case] = (f"conv1d kernel={kernel} stride={stride} padding={padding} dilation={dilation} groups={groups} "
                  f"bias={int(bias)} relu={int(relu)} per_channel={int(per_channel)}")


def linear_case(case, in_shape, k_out, bias=True, relu=False, per_channel=True):
    kin = in_shape[-1]
    x_zp = int(torch.randint(0, 256, (1,)))
    qx = put_input(case, "x", rand_codes(in_shape), f32(0.03), x_zp)
    w = torch.randn(k_out, kin) * (1.0 / kin) ** 0.5
    b = torch.randn(k_out) * 0.5 if bias else None
    ws, wz, wq = weight_qparams(w, per_channel)
    put(f"{case}.w", w)
    put(f"{case}.w_scales", ws)
    put(f"{case}.w_zps", wz)
    put(f"{case}.wq", wq.int_repr())
    if bias:
        put(f"{case}.b", b)
    ref = F.linear(qx.dequantize(), wq.dequantize(), b)
    if relu:
        ref = F.relu(ref)
    os_, oz = minmax_qparams(ref)
    cls = nniq.LinearReLU if relu else nnq.Linear
    m = cls(kin, k_out, bias_=bias) if not relu else cls(kin, k_out, bias=bias)
    m.set_weight_bias(wq, b)
    m.scale = os_
    m.zero_point = oz
    put_output(case, m(qx))
    meta[case] = f"linear bias={int(bias)} relu={int(relu)} per_channel={int(per_channel)}"


def binary_case(case, op, shape, memory_format=torch.contiguous_format, qparams=None):
    """qparams: (x scale, x zp, y scale, y zp, out scale, out zp); default: random zero points and an
    output range from the data."""
    xs, xz, ys, yz, os_, oz = qparams or (0.05, int(torch.randint(0, 256, (1,))), 0.031,
                                          int(torch.randint(0, 256, (1,))), None, None)
    qa = put_input(case, "x", rand_codes(shape, memory_format=memory_format), f32(xs), xz)
    qb = put_input(case, "y", rand_codes(shape, memory_format=memory_format), f32(ys), yz)
    fa, fb = qa.dequantize(), qb.dequantize()
    ref = {"add": fa + fb, "add_relu": F.relu(fa + fb), "mul": fa * fb, "mul_relu": F.relu(fa * fb)}[op]
    if os_ is None:
        os_, oz = minmax_qparams(ref)
        # A slightly narrower output range than the data's, so saturation is exercised too.
        os_ = os_ * 0.9
    os_ = f32(os_)
    qy = getattr(torch.ops.quantized, op)(qa, qb, os_, oz)
    put_output(case, qy)
    meta[case] = f"{op} channels_last={int(memory_format == torch.channels_last)}"


def cat_case(case, shared):
    s_out, z_out = f32(0.04), 100
    if shared:
        # As FX lowers cat: every input already has the output's qparams (one shared observer).
        qa = put_input(case, "x", rand_codes((2, 8, 5, 5)), s_out, z_out)
        qb = put_input(case, "y", rand_codes((2, 12, 5, 5)), s_out, z_out)
    else:
        qa = put_input(case, "x", rand_codes((2, 8, 5, 5)), f32(0.03), 90)
        qb = put_input(case, "y", rand_codes((2, 12, 5, 5)), f32(0.05), 140)
    qy = torch.ops.quantized.cat([qa, qb], 1, s_out, z_out)
    put_output(case, qy)
    meta[case] = f"cat dim=1 shared={int(shared)}"


def unary_case(case, desc, fn, shape=(2, 8, 8, 8), scale=0.05, zp=120, memory_format=torch.contiguous_format):
    codes = all_codes(shape).contiguous(memory_format=memory_format)
    qx = put_input(case, "x", codes, f32(scale), zp)
    put_output(case, fn(qx))
    meta[case] = desc


def make_op_goldens():
    torch.manual_seed(20240601)

    # ---- conv2d (oneDNN) ----
    conv_case("conv3x3_pad1", 2, 8, 16, (10, 10), 3, padding=1)
    conv_case("conv3x3_pad1_relu", 2, 8, 16, (10, 10), 3, padding=1, relu=True)
    conv_case("conv7x7_s2_c3", 1, 3, 8, (32, 32), 7, stride=2, padding=3, x_zp=114, x_scale=0.0187)
    conv_case("conv7x7_s2_c3_nobias", 2, 3, 8, (20, 20), 7, stride=2, padding=3, bias=False, x_zp=77)
    conv_case("conv1x1", 2, 16, 24, (8, 8), 1, bias=False)
    conv_case("conv1x1_s2_bias", 2, 16, 24, (9, 9), 1, stride=2)
    conv_case("conv_grouped", 2, 16, 32, (7, 7), 3, padding=1, groups=4)
    conv_case("conv_depthwise_relu", 2, 16, 16, (9, 9), 3, stride=2, padding=1, groups=16, relu=True)
    conv_case("conv_dilated", 1, 8, 8, (12, 12), 3, padding=2, dilation=2)
    conv_case("conv3x3_per_tensor", 2, 8, 16, (6, 6), 3, padding=1, per_channel=False)
    conv_case("conv3x3_zp0", 2, 8, 16, (6, 6), 3, padding=1, x_zp=0)
    conv_case("conv3x3_relu6", 2, 8, 16, (10, 10), 3, padding=1, x_scale=0.05, then_relu6=True)

    # ---- linear (oneDNN) ----
    linear_case("linear", (4, 32), 24)
    linear_case("linear_relu", (4, 32), 24, relu=True)
    linear_case("linear_nobias_3d", (2, 3, 40), 17, bias=False)
    linear_case("linear_per_tensor", (5, 64), 10, per_channel=False)

    # ---- add / mul (PyTorch CPU kernels) ----
    binary_case("add", "add", (2, 16, 9, 9))
    binary_case("add_relu", "add_relu", (2, 16, 9, 9))
    binary_case("add_nhwc", "add", (2, 16, 9, 9), memory_format=torch.channels_last)
    # Half the output scale of two equal input scales: every other result is an exact tie, so any
    # difference in the dequantization arithmetic shows. PyTorch's vector loop dequantizes with an
    # FMA, its scalar tail (the last numel % 64 elements) without.
    binary_case("add_ties", "add", (2, 16, 9, 9), qparams=(0.02, 37, 0.02, 140, 0.04, 91))
    binary_case("mul", "mul", (2, 16, 9, 9))
    binary_case("mul_relu", "mul_relu", (2, 16, 9, 9))

    # ---- cat ----
    cat_case("cat_shared", True)
    cat_case("cat_requant", False)

    # ---- pooling (PyTorch CPU kernels) ----
    cl = torch.channels_last
    pool_shape = (2, 8, 11, 11)
    unary_case("max_pool3x3_s2", "max_pool2d kernel=3 stride=2 padding=1", lambda q: F.max_pool2d(q, 3, 2, 1),
               shape=(2, 8, 16, 16))
    unary_case("max_pool2x2", "max_pool2d kernel=2 stride=2 padding=0", lambda q: F.max_pool2d(q, 2),
               shape=(2, 8, 16, 16), memory_format=cl)
    for name, fmt in [("", torch.contiguous_format), ("_nhwc", cl)]:
        codes = rand_codes(pool_shape, memory_format=fmt)
        for incl in (1, 0):
            case = f"avg_pool3x3_s2_incl{incl}{name}"
            qx = put_input(case, "x", codes, f32(0.07), 33)
            put_output(case, F.avg_pool2d(qx, 3, 2, 1, count_include_pad=bool(incl)))
            meta[case] = f"avg_pool2d kernel=3 stride=2 padding=1 count_include_pad={incl} channels_last={int(fmt == cl)}"
        case = f"avg_pool2x2{name}"
        qx = put_input(case, "x", codes, f32(0.07), 33)
        put_output(case, F.avg_pool2d(qx, 2))
        meta[case] = f"avg_pool2d kernel=2 stride=2 padding=0 count_include_pad=1 channels_last={int(fmt == cl)}"
        for os_ in ((1, 1), (3, 2), (4, 5)):
            case = f"adaptive_avg_pool_{os_[0]}x{os_[1]}{name}"
            qx = put_input(case, "x", codes, f32(0.07), 33)
            put_output(case, F.adaptive_avg_pool2d(qx, os_))
            meta[case] = f"adaptive_avg_pool2d output={os_[0]},{os_[1]} channels_last={int(fmt == cl)}"

    # 6 x 41 windows: 1 / (6 * 41) and (1 / 6) / 41 differ in float, and PyTorch's NHWC and NCHW
    # kernels use one each.
    codes = rand_codes((1, 16, 12, 82))
    # Every other channel gets exact ties: each 6 x 41 window sums to 123 (mod 246).
    for ch in range(0, 16, 2):
        for h0 in (0, 6):
            for w0 in (0, 41):
                win = codes[0, ch, h0:h0 + 6, w0:w0 + 41].reshape(-1).to(torch.int64)
                delta = (123 - int(win.sum())) % 246
                if delta > 123:
                    delta -= 246
                for i in range(win.numel()):
                    step = max(min(delta, 255 - int(win[i])), -int(win[i]))
                    win[i] += step
                    delta -= step
                codes[0, ch, h0:h0 + 6, w0:w0 + 41] = win.reshape(6, 41).to(torch.uint8)
    for name, fmt in [("", torch.contiguous_format), ("_nhwc", cl)]:
        case = f"adaptive_avg_pool_6x41win{name}"
        qx = put_input(case, "x", codes.contiguous(memory_format=fmt), f32(0.07), 33)
        put_output(case, F.adaptive_avg_pool2d(qx, (2, 2)))
        meta[case] = f"adaptive_avg_pool2d output=2,2 channels_last={int(fmt == cl)}"

    # ---- activations keeping the input's qparams (clamps on codes) ----
    unary_case("relu", "relu", torch.relu)
    unary_case("relu6", "relu6", F.relu6, scale=0.04, zp=30)
    unary_case("relu6_saturating", "relu6", F.relu6, scale=0.01, zp=10)  # 6.0 is above the range
    unary_case("hardtanh", "hardtanh min=-0.5 max=1", lambda q: F.hardtanh(q, -0.5, 1.0))

    # ---- activations with their own output qparams (LUT ops in dbrq) ----
    unary_case("sigmoid", "sigmoid", torch.sigmoid)  # fixed output qparams (1/256, 0)
    unary_case("sigmoid_wide", "sigmoid", torch.sigmoid, scale=0.11, zp=140)
    unary_case("tanh", "tanh", torch.tanh)  # fixed output qparams (2/256, 128)
    unary_case("hardsigmoid", "hardsigmoid", F.hardsigmoid)
    unary_case("hardswish", "hardswish", lambda q: torch.ops.quantized.hardswish(q, f32(0.027), 17))
    unary_case("leaky_relu", "leaky_relu slope=0.1",
               lambda q: torch.ops.quantized.leaky_relu(q, 0.1, False, f32(0.043), 40))
    # Output scale twice the input's: exact ties for every odd code distance (see add_ties).
    unary_case("leaky_relu_ties", "leaky_relu slope=0.5",
               lambda q: torch.ops.quantized.leaky_relu(q, 0.5, False, f32(0.1), 61), zp=121)
    unary_case("gelu", "gelu", F.gelu)  # keeps the input's qparams
    unary_case("gelu_tanh", "gelu approximate=tanh", lambda q: F.gelu(q, approximate="tanh"), scale=0.03, zp=200)
    unary_case("softmax", "softmax dim=3", lambda q: torch.ops.quantized.softmax(q, 3, 1.0 / 256, 0), scale=0.08)
    unary_case("softmax_dim1", "softmax dim=1", lambda q: torch.ops.quantized.softmax(q, 1, 1.0 / 256, 0), scale=0.2)

    # ---- quantize / dequantize / requantize ----
    case = "quantize"
    s, z = f32(0.037), 97
    xf = torch.randn(2, 5, 7, 9) * 3.0
    # Exact ties (k + 0.5) * s, both parities, and far out of range values.
    ties = (torch.arange(-40, 40, dtype=torch.float32) + 0.5) * s
    xf.view(-1)[: ties.numel()] = ties
    xf.view(-1)[-4:] = torch.tensor([1e6, -1e6, 300 * s, -300 * s])
    put(f"{case}.xf", xf)
    qy = torch.quantize_per_tensor(xf, s, z, torch.quint8)
    put_output(case, qy)
    meta[case] = "quantize_per_tensor"

    case = "dequantize"
    qx = put_input(case, "x", all_codes((4, 256)), f32(0.0173), 131)
    put(f"{case}.outf", qx.dequantize())
    meta[case] = "dequantize"

    # requantize_ties: 0.03 -> 0.04 puts every other code on an exact tie, so the dequantization
    # arithmetic must be PyTorch's ((q - zp) * scale, no FMA) for the codes to match.
    for case, (s1, z1), (s2, z2) in [("requantize", (0.0173, 131), (0.021, 70)),
                                     ("requantize_coarser", (0.0173, 131), (0.19, 3)),
                                     ("requantize_ties", (0.03, 90), (0.04, 100))]:
        qx = put_input(case, "x", all_codes((4, 256)), f32(s1), z1)
        put_output(case, torch.quantize_per_tensor(qx.dequantize(), f32(s2), z2, torch.quint8))
        meta[case] = "requantize"

    # ---- matmul of two activations (FX lowering: dequantize, fp32 matmul, quantize) ----
    for case, (ash, bsh) in [("matmul", ((2, 3, 8, 16), (2, 3, 16, 12))), ("matmul_bcast", ((4, 24, 32), (32, 20)))]:
        qa = put_input(case, "x", rand_codes(ash), f32(0.02), 128)
        qb = put_input(case, "y", rand_codes(bsh), f32(0.015), 111)
        ref = torch.matmul(qa.dequantize(), qb.dequantize())
        os_, oz = minmax_qparams(ref)
        put_output(case, torch.quantize_per_tensor(ref, os_, oz, torch.quint8))
        meta[case] = "matmul reference=fx"

    # Cases added later come last, so every earlier case keeps its random data byte for byte.
    unary_case("elu", "elu alpha=1", lambda q: torch.ops.quantized.elu(q, f32(0.031), 133, 1.0))
    unary_case("elu_alpha", "elu alpha=0.5", lambda q: torch.ops.quantized.elu(q, f32(0.027), 40, 0.5),
               scale=0.04, zp=100)
    # batch_norm on its own (pre-activation blocks): PyTorch's quantized::batch_norm{1d,2d}(_relu).
    # 40 channels: PyTorch's vector loop takes 32 channels at a time, its scalar tail the rest.
    bn_case("bn2d", (2, 24, 7, 7), relu=False)
    bn_case("bn2d_relu", (2, 40, 6, 6), relu=True, x_zp=60)
    bn_case("bn2d_no_affine", (2, 16, 5, 5), relu=False, affine=False, eps=1e-3)
    bn_case("bn1d", (16, 20), relu=False)
    bn_case("bn1d_ncl_relu", (4, 12, 9), relu=True, x_zp=200)

    # ---- issue 12 op families: stack, clamp, pad, repeat ----
    # stack as a converted model runs it: inputs brought to the output's parameters, then joined;
    # PyTorch has no quantized stack, so the reference is its quantized cat of unsqueezed inputs.
    for case, dim in [("stack_requant", 1), ("stack_last", -1)]:
        qa = put_input(case, "x", rand_codes((2, 6, 5, 5)), f32(0.03), 90)
        qb = put_input(case, "y", rand_codes((2, 6, 5, 5)), f32(0.05), 140)
        d = dim if dim >= 0 else dim + 5
        put_output(case, torch.ops.quantized.cat([qa.unsqueeze(d), qb.unsqueeze(d)], d, f32(0.04), 100))
        meta[case] = f"stack dim={dim}"
    unary_case("clamp", "clamp min=-1.5 max=2", lambda q: torch.clamp(q, -1.5, 2.0))
    unary_case("clamp_narrow", "clamp min=0.3 max=0.9", lambda q: torch.clamp(q, 0.3, 0.9), scale=0.02, zp=30)
    unary_case("pad_constant", "pad pads=1,2,0,1 mode=constant value=0.55", lambda q: F.pad(q, (1, 2, 0, 1), value=0.55))
    unary_case("pad_constant_zero", "pad pads=2,2,2,2 mode=constant value=0", lambda q: F.pad(q, (2, 2, 2, 2)),
               memory_format=torch.channels_last)
    unary_case("pad_reflect", "pad pads=3,1,2,2 mode=reflect value=0",
               lambda q: F.pad(q, (3, 1, 2, 2), mode="reflect"))
    # PyTorch 1.13 has no quantized replication pad; replicating codes is exact, so the reference
    # is its fp32 replicate pad of the dequantized input, quantized with the input's parameters.
    unary_case("pad_replicate", "pad pads=1,2,3,0 mode=replicate value=0",
               lambda q: torch.quantize_per_tensor(F.pad(q.dequantize(), (1, 2, 3, 0), mode="replicate"),
                                                   q.q_scale(), q.q_zero_point(), torch.quint8))
    unary_case("repeat", "repeat repeats=1,2,1,3", lambda q: q.repeat(1, 2, 1, 3))
    # prelu: PyTorch's quantized::prelu with per-tensor quint8 weights. The weight scale is a power
    # of two that represents 1.0 exactly: PyTorch's positive side multiplies by 1.0 quantized with
    # the weight's parameters (wrong when that saturates; dbrq multiplies by exactly 1), and
    # (q_w - zp_w) stays within s8, dbrq's symmetric weight type.
    for case, w, os_, oz in [("prelu", [0.25, -0.5, 1.5, 0.1, 0.0, 1.9, -1.0, 0.75], 0.043, 110),
                             ("prelu_one", [0.3], 0.03, 100)]:
        qw = torch.quantize_per_tensor(torch.tensor(w), 1.0 / 64, 128, torch.quint8)
        put(f"{case}.w_codes", qw.int_repr())
        put_qparams(case, "w", 1.0 / 64, 128)
        qx = put_input(case, "x", all_codes((2, 8, 8, 8)), f32(0.05), 120)
        put_output(case, torch.ops.quantized.prelu(qx, qw, f32(os_), oz))
        meta[case] = f"prelu weights={len(w)}"
    # softplus and mish have no quantized PyTorch op: the reference is FX's lowering (dequantize,
    # fp32 op, quantize with the output's MinMax parameters), with the input dequantized as
    # PyTorch's quantized activation kernels do (fma(scale, q, scale * -zp), one rounding), which
    # is what dbrq's 256-entry tables use for every activation.
    for case, desc, fn in [("softplus", "softplus beta=1 threshold=20 reference=fx_fma", F.softplus),
                           ("softplus_beta", "softplus beta=2 threshold=3 reference=fx_fma",
                            lambda t: F.softplus(t, beta=2.0, threshold=3.0)),
                           ("mish", "mish reference=fx_fma", F.mish)]:
        qx = put_input(case, "x", all_codes((2, 8, 8, 8)), f32(0.05), 120)
        s_in = torch.tensor(qx.q_scale(), dtype=torch.float32)
        premul = (s_in * -qx.q_zero_point()).double()
        ref = fn((s_in.double() * qx.int_repr().double() + premul).float())
        os_, oz = minmax_qparams(ref)
        put_output(case, torch.quantize_per_tensor(ref, f32(os_), oz, torch.quint8))
        meta[case] = desc
    # ---- issue 12: conv_transpose2d (oneDNN deconvolution in both). PyTorch 1.13's onednn engine
    # quantizes transposed-conv weights per tensor only and refuses output_padding, so the cases do too.
    convt_case("convt_k3_s2_p1", 2, 8, 16, (6, 6), 3, stride=2, padding=1)
    convt_case("convt_dcgan_k4_s2_p1", 2, 16, 8, (4, 4), 4, stride=2, padding=1, bias=False, x_zp=0)
    convt_case("convt_grouped", 1, 8, 8, (5, 5), 3, padding=1, groups=2)
    convt_case("convt_dilated", 1, 4, 6, (5, 5), 3, dilation=2, x_zp=200)

    # ---- issue 12: conv1d (oneDNN in both) and 1-D pooling (PyTorch's CPU kernels) ----
    conv1d_case("c1d_k3_p1", 2, 8, 16, 20, 3, padding=1)
    conv1d_case("c1d_k5_s2_relu", 2, 8, 12, 25, 5, stride=2, padding=2, relu=True)
    conv1d_case("c1d_depthwise_dil2", 1, 8, 8, 16, 3, padding=2, dilation=2, groups=8, x_zp=0)
    conv1d_case("c1d_per_tensor", 1, 4, 6, 12, 3, per_channel=False)
    unary_case("max_pool1d_k3_s2_p1", "max_pool1d kernel=3 stride=2 padding=1",
               lambda q: F.max_pool1d(q, 3, 2, 1), shape=(2, 8, 32))
    unary_case("avg_pool1d_k3_s2_p1", "avg_pool1d kernel=3 stride=2 padding=1",
               lambda q: F.avg_pool1d(q, 3, 2, 1), shape=(2, 8, 32))
    unary_case("avg_pool1d_k4_nopad", "avg_pool1d kernel=4 stride=4 padding=0",
               lambda q: F.avg_pool1d(q, 4), shape=(2, 8, 16), scale=0.03, zp=7)
    unary_case("adaptive_avg_pool1d_5", "adaptive_avg_pool1d output=5",
               lambda q: F.adaptive_avg_pool1d(q, 5), shape=(4, 8, 24))

    # ---- issue 12: interpolate on quantized tensors (PyTorch's quantized upsample kernels) ----
    cl = torch.channels_last
    unary_case("interp_nearest_s2", "interpolate nearest scale=2 channels_last=0",
               lambda q: F.interpolate(q, scale_factor=2.0, mode="nearest"), shape=(2, 8, 4, 8))
    unary_case("interp_nearest_size_nhwc", "interpolate nearest size=7,13 channels_last=1",
               lambda q: F.interpolate(q, size=(7, 13), mode="nearest"), shape=(2, 8, 4, 8), memory_format=cl)
    unary_case("interp_bilinear_s2", "interpolate bilinear scale=2 align_corners=0 channels_last=0",
               lambda q: F.interpolate(q, scale_factor=2.0, mode="bilinear", align_corners=False), shape=(2, 8, 4, 8))
    unary_case("interp_bilinear_ac_size", "interpolate bilinear size=9,11 align_corners=1 channels_last=0",
               lambda q: F.interpolate(q, size=(9, 11), mode="bilinear", align_corners=True), shape=(2, 8, 4, 8),
               scale=0.03, zp=40)
    unary_case("interp_bilinear_s2_nhwc", "interpolate bilinear scale=2 align_corners=0 channels_last=1",
               lambda q: F.interpolate(q, scale_factor=2.0, mode="bilinear", align_corners=False), shape=(2, 8, 4, 8),
               memory_format=cl)

    write_safetensors(os.path.join(GOLDEN_DIR, "int8_ops.safetensors"), tensors, meta)


def bn_case(case, shape, relu, affine=True, eps=1e-5, x_scale=0.04, x_zp=128):
    c = shape[1]
    qx = put_input(case, "x", rand_codes(shape), f32(x_scale), x_zp)
    mean = torch.randn(c) * 0.5
    var = torch.rand(c) * 2 + 0.1
    w = torch.randn(c) * 0.8 + 1.0 if affine else None
    b = torch.randn(c) * 0.3 if affine else None
    put(f"{case}.mean", mean)
    put(f"{case}.var", var)
    if affine:
        put(f"{case}.w", w)
        put(f"{case}.b", b)
    ref = F.batch_norm(qx.dequantize(), mean, var, w, b, False, 0.0, eps)
    if relu:
        ref = F.relu(ref)
    s, z = minmax_qparams(ref)
    s = f32(s)
    if len(shape) == 4:
        op = torch.ops.quantized.batch_norm2d_relu if relu else torch.ops.quantized.batch_norm2d
    else:
        op = torch.ops.quantized.batch_norm1d_relu if relu else torch.ops.quantized.batch_norm1d
    # 1.13's kernels insist on a weight and bias; without affine they are 1 and 0 (exactly what the
    # kernel would use for absent ones), and the file holds none.
    pw, pb = (w, b) if affine else (torch.ones(c), torch.zeros(c))
    put_output(case, op(qx, pw, pb, mean, var, eps, s, z))
    meta[case] = f"batch_norm relu={int(relu)} affine={int(affine)} eps={eps:g}"


# ---------------------------------------------------------------------------------------------
# end-to-end goldens: PyTorch FX on the zoo models

# The zoo's PyTorch twins (same module trees and state-dict keys as samples/zoo).
from torch_zoo import ResNet18W, SmallCnn, randomize_norms  # noqa: E402

# Keep in sync with int8_e2e_test.cc.
SMALL_CNN = {"in_channels": 1, "num_classes": 10}
RESNET = {"base_width": 8, "num_classes": 10}  # the zoo's kTiny variant


def codes_to_input(codes):
    """The model input encoded by u8 codes: (code - 128) / 32, exact in f32."""
    return (codes.to(torch.float32) - 128.0) / 32.0


def round_params_to_half(model):
    """Rounds every float parameter and buffer to a half-precision value (kept in f32): the golden
    stores them as F16 and both sides compute with exactly these numbers."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.dtype == torch.float32:
                t.copy_(t.half().float())


def state_tensors(model):
    out = {}
    for k, v in model.state_dict().items():
        out[k] = v.half() if v.dtype == torch.float32 else v
    return out


def smooth_images(n, c, h, w, gen):
    """Image-like u8 codes: smooth random fields plus noise, spread over most of 0..255."""
    base = torch.randn(n, c, max(h // 4, 2), max(w // 4, 2), generator=gen)
    up = F.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)
    x = up + 0.3 * torch.randn(n, c, h, w, generator=gen)
    return torch.clamp(torch.round(x * 40 + 128), 0, 255).to(torch.uint8)


def fx_convert(model, qconfig_mapping, calib, example):
    # 1.13 has no onednn BackendConfig yet: FX uses its native one (the fbgemm/onednn patterns).
    prepared = prepare_fx(model, qconfig_mapping, example_inputs=(example,))
    with torch.no_grad():
        for i in range(0, calib.shape[0], 8):
            prepared(calib[i:i + 8])
    ranges = observed_ranges(prepared)
    return convert_fx(prepared), ranges


def observed_ranges(prepared):
    """(min, max) of every MinMax activation observer after calibration, keyed by the node it observes."""
    out = {}
    for node in prepared.graph.nodes:
        if node.op == "call_module" and node.target.startswith("activation_post_process"):
            obs = prepared.get_submodule(node.target)
            if hasattr(obs, "min_val") and obs.min_val.numel() == 1:
                out[node.args[0].name] = (float(obs.min_val), float(obs.max_val))
    return out


def fx_qparams(converted):
    """scale / zero point of every quantized tensor FX's converted graph produces, by node name."""
    out = {}
    for node in converted.graph.nodes:
        if node.op == "call_function" and node.target == torch.quantize_per_tensor:
            s = getattr(converted, node.args[1].target)
            z = getattr(converted, node.args[2].target)
            out[f"{node.name}"] = (float(s), int(z))
        elif node.op == "call_module":
            m = converted.get_submodule(node.target)
            if hasattr(m, "scale") and hasattr(m, "zero_point"):
                out[node.target] = (float(m.scale), int(m.zero_point))
        elif node.op == "call_function" and "quantized" in str(node.target):
            # quantized::add_relu(a, b, scale, zero_point) with scale / zp as attributes
            s, z = node.args[2], node.args[3]
            if hasattr(s, "target"):
                out[node.name] = (float(getattr(converted, s.target)), int(getattr(converted, z.target)))
    return out


def int8_logits(converted, last_module, x):
    """The u8 codes of the converted model's last quantized op, before the final dequantize."""
    captured = {}
    handle = converted.get_submodule(last_module).register_forward_hook(
        lambda m, i, o: captured.setdefault("y", o))
    with torch.no_grad():
        y = converted(x)
    handle.remove()
    q = captured["y"]
    assert q.is_quantized
    assert torch.equal(q.dequantize(), y)
    return q


def sqnr_db(ref, x):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()))


def make_e2e_small_cnn():
    torch.manual_seed(11)
    gen = torch.Generator().manual_seed(11)
    model = SmallCnn(**SMALL_CNN)
    randomize_norms(model, gen)
    round_params_to_half(model)
    model.eval()
    calib = smooth_images(64, 1, 8, 8, gen)
    evals = smooth_images(2048, 1, 8, 8, gen)
    xc, xe = codes_to_input(calib), codes_to_input(evals)
    with torch.no_grad():
        fp32 = model(xe)

    # Deterministic observers: MinMax (u8, per-tensor affine) for activations, per-channel
    # symmetric MinMax (s8) for weights.
    qconfig = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine),
                      weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                                                qscheme=torch.per_channel_symmetric))
    converted, ranges = fx_convert(copy_model(model), QConfigMapping().set_global(qconfig), xc, xc[:1])
    q = int8_logits(converted, "fc", xe)
    named = dict(state_tensors(model))
    named.update({
        "calib_codes": calib, "eval_codes": evals, "fp32_logits": fp32,
        "fx_codes": q.int_repr(),
        "fx_scale": torch.tensor([q.q_scale()], dtype=torch.float32),
        "fx_zp": torch.tensor([q.q_zero_point()], dtype=torch.int32),
    })
    for name, (s, z) in fx_qparams(converted).items():
        named[f"fx_qparams.{name}"] = torch.tensor([s, z], dtype=torch.float32)
    # What FX's observers saw: FX calibrates the conv with batch norm already folded, dbrq the
    # unfolded conv -> bn, so the ranges can differ in the last bits; with these, dbrq's qparams
    # are FX's exactly.
    for name, (lo, hi) in ranges.items():
        named[f"fx_range.{name}"] = torch.tensor([lo, hi], dtype=torch.float32)
    print(f"small_cnn: FX SQNR {sqnr_db(fp32, q.dequantize()):.2f} dB; FX qparams {fx_qparams(converted)}")
    meta = {"config": json.dumps(SMALL_CNN, sort_keys=True), "fx_code": converted.code,
            "qconfig": "activation MinMaxObserver(quint8, per_tensor_affine); "
                       "weight PerChannelMinMaxObserver(qint8, per_channel_symmetric)"}
    write_safetensors(os.path.join(GOLDEN_DIR, "e2e_small_cnn.safetensors"), named, meta)


def copy_model(model):
    import copy
    return copy.deepcopy(model)


def make_e2e_resnet18():
    torch.manual_seed(12)
    gen = torch.Generator().manual_seed(12)
    model = ResNet18W(**RESNET)
    randomize_norms(model, gen)
    round_params_to_half(model)
    model.eval()
    calib = smooth_images(24, 3, 32, 32, gen)
    evals = smooth_images(48, 3, 32, 32, gen)
    xc, xe = codes_to_input(calib), codes_to_input(evals)
    with torch.no_grad():
        fp32 = model(xe)
    converted, _ = fx_convert(copy_model(model), get_default_qconfig_mapping("onednn"), xc, xc[:1])
    q = int8_logits(converted, "fc", xe)
    sq = sqnr_db(fp32, q.dequantize())
    print(f"resnet18: FX SQNR {sq:.2f} dB")
    named = dict(state_tensors(model))
    named.update({"calib_codes": calib, "eval_codes": evals, "fp32_logits": fp32,
                  "fx_logits": q.dequantize()})
    meta = {"config": json.dumps(RESNET, sort_keys=True), "fx_code": converted.code, "fx_sqnr_db": f"{sq:.4f}",
            "qconfig": "get_default_qconfig_mapping('onednn'): HistogramObserver(quint8) activations, "
                       "PerChannelMinMaxObserver(qint8, per_channel_symmetric) weights"}
    write_safetensors(os.path.join(GOLDEN_DIR, "e2e_resnet18.safetensors"), named, meta)


if __name__ == "__main__":
    make_op_goldens()
    make_e2e_small_cnn()
    make_e2e_resnet18()
