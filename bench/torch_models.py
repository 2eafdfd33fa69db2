"""The PyTorch side of bench/compare.sh: models, weights export, and PyTorch's fastest paths.

Run with Debian's interpreter (/usr/bin/python3: python3-torch 1.13, python3-torchvision 0.14).

- resnet18 / mobilenet_v2 are torchvision's own classes; bert_encoder is written here with the
  module tree and state-dict keys of samples/zoo/bert_encoder.h (HuggingFace BERT names), so a
  state_dict exported from these models loads into dbrq's zoo models with load_state_dict.
- Every model is randomly initialized under a fixed seed; BatchNorm / LayerNorm statistics and
  affine parameters are randomized too (as tests/models/make_model_goldens.py does), so no norm
  is an identity.
- Debian's PyTorch links a reference BLAS, so nn.Linear and torch.matmul on f32 are slow. The
  encoder therefore has variants whose linears (and optionally its two attention matmuls) run on
  PyTorch's oneDNN path, torch._C._nn.mkldnn_linear on mkldnn tensors; compare.py times every
  variant and keeps PyTorch's fastest.
- safetensors files are written by hand (Debian has no safetensors package): an 8-byte
  little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, raw bytes.
"""

import copy
import json
import math
import struct
import time
import warnings

import torch
import torchvision
from torch import nn

# samples/zoo/zoo.cc, Variant::kFull.
BERT_FULL = {
    "vocab_size": 30522,
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 4,
    "intermediate_size": 1024,
    "max_position": 128,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
}
BERT_SEQ = 128
IMAGE_HW = 224

# ---------------------------------------------------------------------------------------------
# safetensors

_TO_NAME = {torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8", torch.int8: "I8", torch.int32: "I32"}
_FROM_NAME = {v: k for k, v in _TO_NAME.items()}


def write_safetensors(path, tensors):
    """tensors: iterable of (name, tensor), written in that order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()  # native order; x86 is little-endian as the format requires
        header[name] = {"dtype": _TO_NAME[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        lo, hi = h["data_offsets"]
        buf = bytearray(raw[8 + n + lo:8 + n + hi])
        out[name] = torch.frombuffer(buf, dtype=_FROM_NAME[h["dtype"]]).reshape(h["shape"]).clone()
    return out


# ---------------------------------------------------------------------------------------------
# oneDNN-backed linear algebra (PyTorch's own mkldnn ops)


class MkldnnLinear(nn.Module):
    """nn.Linear computed by torch._C._nn.mkldnn_linear; weights converted to mkldnn once."""

    def __init__(self, linear):
        super().__init__()
        self.w = linear.weight.detach().to_mkldnn()
        self.b = linear.bias.detach().to_mkldnn() if linear.bias is not None else None

    def forward(self, x):
        return torch._C._nn.mkldnn_linear(x.to_mkldnn(), self.w, self.b).to_dense()


def matmul_onednn(a, b):
    """a [..., M, K] @ b [..., K, N] (same batch dims) as one mkldnn_linear per matrix."""
    batch = a.shape[:-2]
    a2 = a.reshape(-1, a.shape[-2], a.shape[-1])
    bt = b.transpose(-1, -2).reshape(-1, b.shape[-1], b.shape[-2])  # [B, N, K]: the "weight"
    outs = [torch._C._nn.mkldnn_linear(a2[i].contiguous().to_mkldnn(), bt[i].contiguous().to_mkldnn(), None).to_dense()
            for i in range(a2.shape[0])]
    return torch.stack(outs).reshape(*batch, a.shape[-2], b.shape[-1])


# ---------------------------------------------------------------------------------------------
# the BERT-style encoder of samples/zoo/bert_encoder.h


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], dtype=torch.long)
        token_types = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.num_heads = c["num_heads"]
        self.head_size = h // self.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dropout = nn.Dropout(0.1)
        self.matmul = torch.matmul  # or matmul_onednn (set_attention_matmul)

    def split_heads(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden):
        q = self.split_heads(self.query(hidden))
        k = self.split_heads(self.key(hidden))
        v = self.split_heads(self.value(hidden))
        scores = self.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(torch.softmax(scores, -1))
        context = self.matmul(probs, v).permute(0, 2, 1, 3)
        return context.reshape(hidden.shape[0], hidden.shape[1], self.num_heads * self.head_size)


class BertResidualOutput(nn.Module):
    def __init__(self, in_features, c):
        super().__init__()
        self.dense = nn.Linear(in_features, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertResidualOutput(c["hidden_size"], c)

    def forward(self, hidden):
        return self.output(self.self(hidden), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.intermediate_act_fn = nn.GELU()

    def forward(self, hidden):
        return self.intermediate_act_fn(self.dense(hidden))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertResidualOutput(c["intermediate_size"], c)

    def forward(self, hidden):
        attended = self.attention(hidden)
        return self.output(self.intermediate(attended), attended)


class BertLayerStack(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_layers"])])

    def forward(self, hidden):
        for layer in self.layer:
            hidden = layer(hidden)
        return hidden


class BertEncoder(nn.Module):
    def __init__(self, c=BERT_FULL):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertLayerStack(c)

    def forward(self, input_ids):
        return self.encoder(self.embeddings(input_ids))


def with_mkldnn_linears(model):
    """A copy of `model` whose every nn.Linear runs on mkldnn_linear (same weights)."""
    m = copy.deepcopy(model)
    for name, child in list(m.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, nn.Linear):
                setattr(child, attr, MkldnnLinear(sub))
    return m


def set_attention_matmul(model, fn):
    for mod in model.modules():
        if isinstance(mod, BertSelfAttention):
            mod.matmul = fn
    return model


# ---------------------------------------------------------------------------------------------
# models and data


def randomize_norms(model, gen):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
                m.num_batches_tracked.fill_(100)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def make_model(name, seed):
    torch.manual_seed(seed)
    if name == "resnet18":
        m = torchvision.models.resnet18()
    elif name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2()
    elif name == "bert_encoder":
        m = BertEncoder(BERT_FULL)
    else:
        raise ValueError(f"unknown model {name}")
    randomize_norms(m, torch.Generator().manual_seed(seed + 1000))
    return m.eval()


def make_inputs(name, seed):
    """The inputs both sides use, under the keys bench/dbrq_bench.cc reads by default."""
    g = torch.Generator().manual_seed(seed)
    if name == "bert_encoder":
        ids = lambda n: torch.randint(0, BERT_FULL["vocab_size"], (n, BERT_SEQ), generator=g, dtype=torch.int64)
        calib = [ids(4), ids(4)]
        return {"ids_bs1": ids(1), "ids_bs8": ids(8), "ids_example": calib[0][:1].clone(),
                "ids_calib0": calib[0], "ids_calib1": calib[1]}
    img = lambda n: torch.randn(n, 3, IMAGE_HW, IMAGE_HW, generator=g)
    calib = [img(8), img(8)]  # 16 calibration images in two batches of 8
    return {"x_bs1": img(1), "x_bs8": img(8), "example": calib[0][:1].clone(), "calib0": calib[0], "calib1": calib[1]}


def calibration(inputs, name):
    p = "ids_" if name == "bert_encoder" else ""
    return [inputs[p + "calib0"], inputs[p + "calib1"]]


def example(inputs, name):
    return inputs["ids_example" if name == "bert_encoder" else "example"]


def timed_input(inputs, name, batch):
    return inputs[f"ids_bs{batch}" if name == "bert_encoder" else f"x_bs{batch}"]


# ---------------------------------------------------------------------------------------------
# PyTorch's variants: name -> (callable model, input)


def fp32_variants(name, model, x):
    if name == "bert_encoder":
        lin = with_mkldnn_linears(model)
        both = set_attention_matmul(with_mkldnn_linears(model), matmul_onednn)
        return {"nn.Linear": (model, x), "mkldnn_linear": (lin, x), "mkldnn_linear+attn": (both, x)}
    cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    return {"nchw": (model, x), "channels_last": (cl, x.contiguous(memory_format=torch.channels_last))}


def torchscript_variant(model, x):
    """TorchScript, frozen and optimize_for_inference'd (convs rewritten to oneDNN): PyTorch's
    fastest fp32 CNN path here. Eager PyTorch sends 1x1 convolutions with batch < 16 on one
    thread to its slow path (im2col + the reference BLAS), which optimize_for_inference avoids."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        j = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(copy.deepcopy(model), x)))
        for _ in range(3):  # the profiling executor optimizes over the first calls
            j(x)
    return j


def fx_int8(model, example_input, calib, copy_model=True, timings=None):
    """PyTorch FX post-training static quantization on the onednn engine (prepare_fx, calibration
    on every batch of `calib`, convert_fx). copy_model=False quantizes `model` itself."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "onednn"
    t0 = time.perf_counter()
    m = prepare_fx(copy.deepcopy(model) if copy_model else model, get_default_qconfig_mapping("onednn"),
                   example_inputs=(example_input,))
    t1 = time.perf_counter()
    with torch.no_grad():
        for b in calib:
            m(b)
    t2 = time.perf_counter()
    q = convert_fx(m)
    t3 = time.perf_counter()
    if timings is not None:
        timings.update(prepare_s=t1 - t0, calibrate_s=t2 - t1, convert_s=t3 - t2, total_s=t3 - t0)
    return q


def int8_variants(q, x):
    return {"fx nchw": (q, x), "fx channels_last": (q, x.contiguous(memory_format=torch.channels_last))}


def dynamic_int8_variants(model, x):
    """quantize_dynamic (onednn) of the encoder's linears; attention matmuls eager or on oneDNN."""
    torch.backends.quantized.engine = "onednn"
    qd = torch.ao.quantization.quantize_dynamic
    dq = qd(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    dq_attn = qd(set_attention_matmul(copy.deepcopy(model), matmul_onednn), {nn.Linear}, dtype=torch.qint8)
    return {"dynamic": (dq, x), "dynamic+mkldnn attn": (dq_attn, x)}
