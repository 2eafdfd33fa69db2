"""The PyTorch side of bench/compare.sh: models, weights export, and PyTorch's fastest paths.

Run with Debian's interpreter (/usr/bin/python3: python3-torch 1.13, python3-torchvision 0.14).

- resnet18 / mobilenet_v2 are torchvision's own classes; bert_encoder (tools/torch_zoo.py) has the
  module tree and state-dict keys of samples/zoo/bert_encoder.h (HuggingFace BERT names), so a
  state_dict exported from these models loads into dbrq's zoo models with load_state_dict.
- Every model is randomly initialized under a fixed seed; BatchNorm / LayerNorm statistics and
  affine parameters are randomized too (as tests/models/make_model_goldens.py does), so no norm
  is an identity.
- Debian's PyTorch links a reference BLAS, so nn.Linear and torch.matmul on f32 are slow. The
  encoder therefore has variants whose linears (and optionally its two attention matmuls) run on
  PyTorch's oneDNN path, torch._C._nn.mkldnn_linear on mkldnn tensors; compare.py times every
  variant and keeps PyTorch's fastest.
- gru_classifier (tools/torch_zoo.py) mirrors samples/zoo/gru_classifier.h: nn.Embedding, an
  nn.GRU over pack_padded_sequence, nn.Linear. nn.GRU's matrix products also go through the
  reference BLAS, so there is a second fp32 variant, GruOnOnednn: the same recurrence written as a
  Python loop (dbrq's algorithm: all input projections in one product, then one product of the
  hidden state per step, packed by length) on mkldnn_linear. Its dynamic int8 is
  quantize_dynamic(model, dtype=torch.qint8) on the onednn engine (DynamicQuantizedGRU, Linear).
- unet (tools/torch_zoo.py) mirrors samples/zoo/unet.h at full size (base width 32, 128x128
  images). FX quantizes it with get_default_qconfig_mapping('onednn') except per-tensor
  ConvTranspose2d weights (FX 1.13 refuses per-channel ones); the mapping is otherwise unchanged
  for the other models.
- vit (tools/torch_zoo.py) mirrors samples/zoo/vit.h (timm's names) at its full size: 32x32 images,
  patch 4, d_model 192, 6 layers, 3 heads, MLP 768. Its fp32 variants are the encoder's (nn.Linear,
  mkldnn_linear, mkldnn_linear with oneDNN attention matmuls); its int8 is FX (fx_int8).
- The encoder's classes, the GRU classifier, the U-Net, the ViT, randomize_norms and the safetensors reader / writer
  come from tools/torch_zoo.py, shared with the other PyTorch scripts.
"""

import copy
import os
import sys
import time
import warnings

import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from torch_zoo import BertEncoder, BertSelfAttention, CausalSelfAttention, DecoderLM, randomize_norms  # noqa: E402,F401
from torch_zoo import GruClassifier, gru_classifier_ids  # noqa: E402
from torch_zoo import UNet  # noqa: E402
from torch_zoo import VisionTransformer, VitAttention  # noqa: E402
from torch_zoo import read_safetensors, write_safetensors  # noqa: E402,F401  (compare.py uses them)

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
# samples/zoo/zoo.cc decoder_lm_config(Variant::kFull).
DECODER_FULL = {
    "vocab_size": 1024,
    "d_model": 256,
    "num_layers": 4,
    "num_heads": 4,
    "d_ff": 1024,
    "max_positions": 256,
    "layer_norm_eps": 1e-5,
}
DECODER_PROMPT = 32      # timed prompt length
DECODER_NEW_TOKENS = 96  # tokens generated per timed run (and per calibration prompt)
DECODER_CALIB = (32, 24, 40, 16)  # calibration prompt lengths (longest cache: 40 + 96 positions)
# samples/zoo/zoo.cc, Variant::kFull, and gru_example_seq_len.
GRU_FULL = {"vocab_size": 10000, "embedding_dim": 128, "hidden_size": 128, "num_layers": 2, "num_classes": 4}
GRU_STEPS = 64
GRU_CALIB_BATCHES = 16  # of 8 sequences; bench/dbrq_bench.cc calibrates on all of them
TOKEN_MODELS = ("bert_encoder", "gru_classifier", "decoder_lm")
# samples/zoo/zoo.cc unet_config(Variant::kFull) and unet_example_hw.
UNET_FULL = {"in_channels": 3, "num_classes": 4, "base_width": 32}
UNET_HW = 128
# samples/zoo/zoo.cc vit_config(Variant::kFull).
VIT_FULL = {"image_size": 32, "patch_size": 4, "in_channels": 3, "num_classes": 10, "d_model": 192,
            "num_layers": 6, "num_heads": 3, "mlp_dim": 768, "layer_norm_eps": 1e-6}

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
# the encoder on oneDNN


def with_mkldnn_linears(model):
    """A copy of `model` whose every nn.Linear runs on mkldnn_linear (same weights)."""
    m = copy.deepcopy(model)
    for name, child in list(m.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, nn.Linear):
                setattr(child, attr, MkldnnLinear(sub))
    return m


def set_attention_matmul(model, fn):
    """Runs the two attention matmuls of every BertSelfAttention / CausalSelfAttention / VitAttention
    of `model` on `fn`."""
    for mod in model.modules():
        if isinstance(mod, (BertSelfAttention, CausalSelfAttention, VitAttention)):
            mod.matmul = fn
    return model


# ---------------------------------------------------------------------------------------------
# the GRU classifier on oneDNN


class GruOnOnednn(nn.Module):
    """GruClassifier's forward with the GRU written out on mkldnn_linear (same weights, same
    result to float rounding): per layer, every step's input projection in one product, then per
    step one product of the hidden state of the sequences still running (sorted longest first),
    the gates in PyTorch's GRUCell order."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        gru = model.gru
        assert not gru.bidirectional and gru.bias
        self.hidden = gru.hidden_size
        self.weights = [[getattr(gru, f"{k}_l{layer}").detach().to_mkldnn()
                         for k in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")]
                        for layer in range(gru.num_layers)]

    def forward(self, ids):
        lengths = self.model.lengths_of(ids)
        steps = int(lengths.max())
        order = torch.argsort(lengths, descending=True, stable=True)
        sorted_lengths = lengths[order].tolist()
        x = self.model.embedding(ids[order, :steps]).transpose(0, 1).contiguous()  # [T, B, E]
        batch, hidden, lin = x.shape[1], self.hidden, torch._C._nn.mkldnn_linear
        running = [sum(1 for n in sorted_lengths if n > t) for t in range(steps)]
        for w_ih, b_ih, w_hh, b_hh in self.weights:
            projected = lin(x.reshape(steps * batch, -1).to_mkldnn(), w_ih, b_ih).to_dense()
            projected = projected.view(steps, batch, 3 * hidden)
            h = torch.zeros(batch, hidden)
            out = torch.zeros(steps, batch, hidden)
            for t in range(steps):
                n = running[t]
                h_run, gi = h[:n], projected[t, :n]
                gh = lin(h_run.to_mkldnn(), w_hh, b_hh).to_dense()
                rz = torch.sigmoid(gi[:, :2 * hidden] + gh[:, :2 * hidden])
                new = torch.tanh(gi[:, 2 * hidden:] + rz[:, :hidden] * gh[:, 2 * hidden:])
                h_next = new + rz[:, hidden:] * (h_run - new)
                h[:n] = h_next
                out[t, :n] = h_next
            x = out
        h_last = torch.empty_like(h)
        h_last[order] = h
        return self.model.classifier(h_last)


# ---------------------------------------------------------------------------------------------
# models and data


def make_model(name, seed):
    torch.manual_seed(seed)
    if name == "resnet18":
        m = torchvision.models.resnet18()
    elif name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2()
    elif name == "densenet":
        m = torchvision.models.densenet121()  # the zoo's "densenet" (samples/zoo/densenet.h), same keys
    elif name == "bert_encoder":
        m = BertEncoder(BERT_FULL)
    elif name == "decoder_lm":
        m = DecoderLM(DECODER_FULL)
    elif name == "gru_classifier":
        m = GruClassifier(**GRU_FULL)
    elif name == "unet":
        m = UNet(**UNET_FULL)
    elif name == "vit":
        m = VisionTransformer(VIT_FULL)
    else:
        raise ValueError(f"unknown model {name}")
    randomize_norms(m, torch.Generator().manual_seed(seed + 1000), num_batches_tracked=100)
    return m.eval()


def make_inputs(name, seed):
    """The inputs both sides use, under the keys bench/dbrq_bench.cc reads by default."""
    g = torch.Generator().manual_seed(seed)
    if name == "decoder_lm":
        ids = lambda n: torch.randint(0, DECODER_FULL["vocab_size"], (1, n), generator=g, dtype=torch.int64)
        out = {"ids_prompt": ids(DECODER_PROMPT), "ids_example": ids(DECODER_PROMPT)}
        for i, n in enumerate(DECODER_CALIB):
            out[f"ids_calib{i}"] = ids(n)
        return out
    if name == "gru_classifier":
        # Batch 1: one sequence of the full 64 tokens; batch 8 and calibration: lengths 16..64.
        full = torch.randint(1, GRU_FULL["vocab_size"], (1, GRU_STEPS), generator=g, dtype=torch.int64)
        ids = lambda n: gru_classifier_ids(n, GRU_STEPS, GRU_FULL["vocab_size"], g)
        out = {"ids_bs1": full, "ids_bs8": ids(8), "ids_example": full.clone(), "ids_calib0": ids(8),
               "ids_calib1": ids(8)}
        # Issue 11: 14 more calibration batches (16 in all, 128 sequences), drawn after the others
        # so those stay as they were. Two batches gave the logits' range from 64 values.
        for i in range(2, GRU_CALIB_BATCHES):
            out[f"ids_calib{i}"] = ids(8)
        return out
    if name == "bert_encoder":
        ids = lambda n: torch.randint(0, BERT_FULL["vocab_size"], (n, BERT_SEQ), generator=g, dtype=torch.int64)
        calib = [ids(4), ids(4)]
        return {"ids_bs1": ids(1), "ids_bs8": ids(8), "ids_example": calib[0][:1].clone(),
                "ids_calib0": calib[0], "ids_calib1": calib[1]}
    hw = UNET_HW if name == "unet" else VIT_FULL["image_size"] if name == "vit" else IMAGE_HW
    img = lambda n: torch.randn(n, 3, hw, hw, generator=g)
    calib = [img(8), img(8)]  # 16 calibration images in two batches of 8
    return {"x_bs1": img(1), "x_bs8": img(8), "example": calib[0][:1].clone(), "calib0": calib[0], "calib1": calib[1]}


def calibration(inputs, name):
    p = "ids_" if name in TOKEN_MODELS else ""
    return [inputs[p + "calib0"], inputs[p + "calib1"]]


def example(inputs, name):
    return inputs["ids_example" if name in TOKEN_MODELS else "example"]


def timed_input(inputs, name, batch):
    if name == "decoder_lm":
        return inputs["ids_prompt"]
    return inputs[f"ids_bs{batch}" if name in TOKEN_MODELS else f"x_bs{batch}"]


# ---------------------------------------------------------------------------------------------
# PyTorch's variants: name -> (callable model, input)


def fp32_variants(name, model, x):
    if name == "gru_classifier":
        return {"nn.GRU packed": (model, x), "loop on mkldnn_linear": (GruOnOnednn(model).eval(), x)}
    if name in ("bert_encoder", "vit"):
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


def fx_qconfig_mapping():
    """get_default_qconfig_mapping('onednn'), except ConvTranspose2d's weights per-tensor
    (MinMaxObserver qint8): FX 1.13 asserts on per-channel ConvTranspose weights."""
    from torch.ao.quantization import QConfig, default_weight_observer, get_default_qconfig_mapping

    mapping = get_default_qconfig_mapping("onednn")
    act = mapping.global_qconfig.activation
    return mapping.set_object_type(nn.ConvTranspose2d, QConfig(activation=act, weight=default_weight_observer))


def fx_int8(model, example_input, calib, copy_model=True, timings=None):
    """PyTorch FX post-training static quantization on the onednn engine (prepare_fx, calibration
    on every batch of `calib`, convert_fx). copy_model=False quantizes `model` itself."""
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "onednn"
    t0 = time.perf_counter()
    m = prepare_fx(copy.deepcopy(model) if copy_model else model, fx_qconfig_mapping(),
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


def gru_dynamic_int8(model):
    """quantize_dynamic (onednn) with its default spec: the GRU and the Linear head."""
    torch.backends.quantized.engine = "onednn"
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), dtype=torch.qint8)


def dynamic_int8_variants(model, x):
    """quantize_dynamic (onednn) of the encoder's linears; attention matmuls eager or on oneDNN."""
    torch.backends.quantized.engine = "onednn"
    qd = torch.ao.quantization.quantize_dynamic
    dq = qd(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    dq_attn = qd(set_attention_matmul(copy.deepcopy(model), matmul_onednn), {nn.Linear}, dtype=torch.qint8)
    return {"dynamic": (dq, x), "dynamic+mkldnn attn": (dq_attn, x)}


# ---------------------------------------------------------------------------------------------
# the decoder LM, timed generating


class Generate:
    """Callable like the other timed models (takes the prompt ids [1, S]): DecoderLM.generate of
    `new_tokens` greedy tokens (the prompt in one call, then one token per call through the cache),
    as dbrq_bench times DecoderLM::generate. Returns (tokens, logits of every generated token)."""

    def __init__(self, model, new_tokens=DECODER_NEW_TOKENS):
        self.model, self.new_tokens = model, new_tokens

    def __call__(self, prompt):
        return self.model.generate(prompt[0].tolist(), self.new_tokens)


def decoder_fp32_variants(model):
    """PyTorch's fp32 generation: plain nn.Linear (Debian's reference BLAS), linears on
    mkldnn_linear, and those plus the attention matmuls on mkldnn_linear."""
    lin = with_mkldnn_linears(model)
    both = set_attention_matmul(with_mkldnn_linears(model), matmul_onednn)
    return {"nn.Linear": Generate(model), "mkldnn_linear": Generate(lin), "mkldnn_linear+attn": Generate(both)}


def decoder_dynamic_int8_variants(model):
    """quantize_dynamic (onednn) of the decoder's linears; attention matmuls eager or on oneDNN."""
    torch.backends.quantized.engine = "onednn"
    qd = torch.ao.quantization.quantize_dynamic
    dq = qd(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    dq_attn = qd(set_attention_matmul(copy.deepcopy(model), matmul_onednn), {nn.Linear}, dtype=torch.qint8)
    return {"dynamic": Generate(dq), "dynamic+mkldnn attn": Generate(dq_attn)}
