#!/usr/bin/python3
"""Regenerates the zoo golden files in tests/models/golden/.

Run with Debian's interpreter, which has python3-torch 1.13 and python3-torchvision 0.14:

    /usr/bin/python3 tests/models/make_model_goldens.py

For each zoo model (samples/zoo) this builds the reduced ("tiny") configuration in PyTorch with the
same module tree and state-dict keys as the C++ model, randomizes it under a fixed seed (BatchNorm
running statistics and affine parameters included, so BN is not an identity), runs it in eval mode
and writes <model>.safetensors holding:

    every state-dict tensor under its own key,
    "input"  the example input (f32 images or i64 token ids),
    "output" the reference output, computed in float64 from the same f32 weights and input so the
             reference itself carries no f32 rounding,
    __metadata__ {"config": ...} with the configuration, which the C++ test checks against its own.

The decoder LM's file also holds greedy generations (see write_decoder_golden).

It also writes torchvision_keys.txt: the ordered state-dict keys, dtypes and shapes of full-size
torchvision.models.resnet18() and mobilenet_v2(), one "model key dtype dims..." line per tensor.

vit_int8.safetensors (for vit_test): see write_vit_int8_references (PyTorch FX int8 on the same
weights and calibration batches).

gru_classifier_int8.safetensors (for gru_classifier_test; the weights are gru_classifier's) holds
token-id batches of other sizes and lengths than the golden input ("ids_<k>": batch 1, equal
lengths, a row with a 0 inside it, padded widths from 5 to 40), and for each the float64
reference "fp32_<k>" and PyTorch's dynamic int8 result "torch_dyn_<k>":
torch.quantization.quantize_dynamic(model, dtype=torch.qint8) with its default qconfig (the GRU
and the Linear; per-tensor weights; onednn engine), as a user of PyTorch would quantize it.

ResNet-18 at reduced width uses torchvision's own BasicBlock, _make_layer and forward; only the
hard-coded 64 of ResNet.__init__ is replaced (and the script asserts that width 64 reproduces
torchvision.models.resnet18() key for key). MobileNetV2 is torchvision's class, which takes
width_mult itself. ResNet18W, the BERT encoder, the decoder LM, SmallCnn, the GRU classifier and the
safetensors writer are shared with the other PyTorch scripts in tools/torch_zoo.py.
"""

import copy
import json
import os
import sys

import torch
import torchvision
from torchvision.models.mobilenetv2 import MobileNetV2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from torch_zoo import (BertEncoder, DcganGenerator, DecoderLM, GruClassifier, KwsConv1d, ResNet18W,  # noqa: E402
                       SmallCnn, UNet, VisionTransformer, densenet, gru_classifier_ids, randomize_norms,
                       write_safetensors)

GOLDEN_DIR = os.path.join(HERE, "golden")

# Keep in sync with samples/zoo/zoo.cc (Variant::kTiny) and tests/models/models_golden_test.cc.
RESNET_TINY = {"base_width": 8, "num_classes": 10}
MOBILENET_TINY = {"width_mult": 0.25, "num_classes": 10}
BERT_TINY = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 128,
    "max_position": 32,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
}
SMALL_CNN = {"in_channels": 1, "num_classes": 10}
DECODER_TINY = {
    "vocab_size": 128,
    "d_model": 64,
    "num_layers": 2,
    "num_heads": 2,
    "d_ff": 256,
    "max_positions": 64,
    "layer_norm_eps": 1e-5,
}
# Greedy generation goldens: (prompt length, new tokens) per prompt; no stop token.
DECODER_PROMPTS = [(8, 24), (3, 24)]
GRU_TINY = {"vocab_size": 50, "embedding_dim": 16, "hidden_size": 24, "num_layers": 2, "num_classes": 4}
GRU_TINY_STEPS = 12  # samples/zoo/zoo.cc gru_example_seq_len(kTiny)
DENSENET_TINY = {"growth_rate": 8, "block_config": [2, 2], "num_init_features": 16, "bn_size": 2, "num_classes": 10}

# Issue 12's models (samples/zoo/zoo.cc Variant::kTiny).
DCGAN_TINY = {"nz": 16, "ngf": 8, "nc": 3}
UNET_TINY = {"in_channels": 3, "num_classes": 4, "base_width": 8}
UNET_TINY_HW = 64
KWS_TINY = {"n_mfcc": 40, "channels": 16, "num_classes": 12}
KWS_FRAMES = 98
CALIB_BATCH = 8  # FX and dbrq both calibrate on batches of 8, in file order
VIT_TINY = {"image_size": 16, "patch_size": 4, "in_channels": 3, "num_classes": 10, "d_model": 32,
            "num_layers": 2, "num_heads": 2, "mlp_dim": 64, "layer_norm_eps": 1e-6}
VIT_CALIB_BATCHES = 4  # of 8 images each

DBRQ_DTYPE_NAMES = {torch.float32: "f32", torch.int64: "s64"}


# ---------------------------------------------------------------------------------------------
# helpers


def key_shapes(model):
    return [(k, v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()]


def reference_output(model, x):
    """The model's output in float64 (weights and input are exactly the f32 values we store)."""
    m64 = model.double().eval()
    with torch.no_grad():
        y = m64(x.double() if x.is_floating_point() else x)
    model.float()
    return y.float()


def write_golden(name, model, x, config):
    model.eval()
    y = reference_output(model, x)
    with torch.no_grad():
        y32 = model(x)  # PyTorch's own f32 result: how far f32 arithmetic alone drifts
    f32_err = float((y32 - y).abs().max() / y.abs().max())
    tensors = list(model.state_dict().items()) + [("input", x), ("output", y)]
    path = os.path.join(GOLDEN_DIR, f"{name}.safetensors")
    metadata = {"config": json.dumps(config, sort_keys=True), "torch": torch.__version__,
                "torchvision": torchvision.__version__}
    write_safetensors(path, tensors, metadata)
    print(f"{name}: {os.path.getsize(path)} bytes, input {list(x.shape)}, output {list(y.shape)}, "
          f"torch f32 vs f64 relative error {f32_err:.2e}")


def write_decoder_golden(name, model, prompts, config):
    """decoder_lm.safetensors: the state dict; "input" / "output": the first prompt and its logits (one
    call, empty cache); per prompt p, "prompt<p>", "tokens<p>" (greedy continuation, i64) and
    "step_logits<p>" [tokens, vocab] (the logits each token was the argmax of). Logits and tokens come
    from the float64 model; the script refuses a case where float32 could pick another token (the
    top-2 margin of every step must exceed 1e-4 of the logits' scale, 100x the f32 drift)."""
    model.eval()
    m64 = copy.deepcopy(model).double()
    tensors = list(model.state_dict().items())
    with torch.no_grad():
        prompt_logits = m64(prompts[0])[0].float()
    tensors += [("input", prompts[0]), ("output", prompt_logits)]
    lengths = []
    for p, (prompt, (_, new_tokens)) in enumerate(zip(prompts, DECODER_PROMPTS)):
        tokens, logits = m64.generate(prompt[0].tolist(), new_tokens)
        tokens32, _ = model.generate(prompt[0].tolist(), new_tokens)
        assert tokens32 == tokens, f"prompt {p}: float32 and float64 greedy tokens differ"
        top2 = logits.topk(2, dim=1).values
        margin = float((top2[:, 0] - top2[:, 1]).min() / logits.abs().max())
        assert margin > 1e-4, f"prompt {p}: a near tie between the top two logits ({margin:.1e}); change the seed"
        tensors += [(f"prompt{p}", prompt), (f"tokens{p}", torch.tensor(tokens, dtype=torch.int64)),
                    (f"step_logits{p}", logits.float())]
        lengths.append(f"{prompt.shape[1]}+{len(tokens)} (min top-2 margin {margin:.1e})")
    path = os.path.join(GOLDEN_DIR, f"{name}.safetensors")
    metadata = {"config": json.dumps(config, sort_keys=True), "torch": torch.__version__,
                "torchvision": torchvision.__version__}
    write_safetensors(path, tensors, metadata)
    print(f"{name}: {os.path.getsize(path)} bytes, prompts+generated {', '.join(lengths)}")
def write_gru_int8_references(model, gen):
    torch.backends.quantized.engine = "onednn"
    model.eval()
    qmodel = torch.quantization.quantize_dynamic(copy.deepcopy(model), dtype=torch.qint8)
    vocab = GRU_TINY["vocab_size"]
    batches = [gru_classifier_ids(1, 5, vocab, gen), gru_classifier_ids(1, 30, vocab, gen),
               torch.randint(1, vocab, (3, 20), generator=gen),  # equal lengths, no padding
               gru_classifier_ids(7, 25, vocab, gen), gru_classifier_ids(16, 40, vocab, gen),
               gru_classifier_ids(2, 12, vocab, gen)]
    batches[3][0, 2] = 0  # a row's length ends at its first 0, whatever follows
    tensors = []
    for k, ids in enumerate(batches):
        with torch.no_grad():
            tensors += [(f"ids_{k}", ids), (f"fp32_{k}", reference_output(model, ids)), (f"torch_dyn_{k}", qmodel(ids))]
    path = os.path.join(GOLDEN_DIR, "gru_classifier_int8.safetensors")
    write_safetensors(path, tensors, {"torch": torch.__version__, "engine": torch.backends.quantized.engine})
    print(f"gru_classifier_int8: {os.path.getsize(path)} bytes, {len(batches)} batches")


def write_vit_int8_references(model, gen):
    """vit_int8.safetensors (for vit_test; the weights are vit.safetensors'): calibration batches
    "calib_<k>" [8, 3, 16, 16], evaluation batches "x_<k>" (batch 16 and batch 3), each with its float64
    reference "fp32_<k>" and PyTorch FX's int8 result "fx_<k>": prepare_fx with
    get_default_qconfig_mapping("onednn") on the onednn engine, calibrated on exactly the calib
    batches, convert_fx."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "onednn"
    model.eval()
    hw = VIT_TINY["image_size"]
    calib = [torch.randn(8, 3, hw, hw, generator=gen) for _ in range(VIT_CALIB_BATCHES)]
    evals = [torch.randn(16, 3, hw, hw, generator=gen), torch.randn(3, 3, hw, hw, generator=gen)]
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("onednn"), example_inputs=(calib[0],))
    with torch.no_grad():
        for b in calib:
            prepared(b)
    fx = convert_fx(prepared)
    tensors = [(f"calib_{k}", b) for k, b in enumerate(calib)]
    sqnrs = []
    for k, x in enumerate(evals):
        ref = reference_output(model, x)
        with torch.no_grad():
            q = fx(x)
        sqnrs.append(float(10 * torch.log10(ref.pow(2).sum() / (q - ref).pow(2).sum())))
        tensors += [(f"x_{k}", x), (f"fp32_{k}", ref), (f"fx_{k}", q)]
    path = os.path.join(GOLDEN_DIR, "vit_int8.safetensors")
    write_safetensors(path, tensors, {"torch": torch.__version__, "engine": torch.backends.quantized.engine,
                                      "config": json.dumps(VIT_TINY, sort_keys=True)})
    print(f"vit_int8: {os.path.getsize(path)} bytes, FX int8 SQNR vs fp32 "
          f"{', '.join(f'{s:.2f}' for s in sqnrs)} dB")


# ---------------------------------------------------------------------------------------------
# issue 12's models: int8 references from PyTorch FX


def smooth_images(n, c, hw, gen):
    """Image-like inputs: a smooth random field (bilinear upsampling of a coarse one) plus noise."""
    base = torch.randn(n, c, hw // 8, hw // 8, generator=gen)
    up = torch.nn.functional.interpolate(base, size=(hw, hw), mode="bilinear", align_corners=False)
    return up + 0.3 * torch.randn(n, c, hw, hw, generator=gen)


def mfcc_like(n, c, frames, gen):
    """MFCC-like features: per-coefficient offsets and scales (the low coefficients carry most of
    the energy) times a random signal smoothed over 3 frames."""
    x = torch.randn(n, c, frames + 2, generator=gen)
    x = (x[:, :, :-2] + x[:, :, 1:-1] + x[:, :, 2:]) / 3
    scale = 2.0 / (1.0 + torch.arange(c, dtype=torch.float32) / 4)
    offset = torch.randn(c, generator=gen) * 0.5
    return x * scale[None, :, None] + offset[None, :, None]


FX_QCONFIG_NOTE = ("get_default_qconfig_mapping('onednn') (HistogramObserver quint8 activations, "
                   "PerChannelMinMaxObserver qint8 weights); ConvTranspose2d with per-tensor MinMaxObserver "
                   "qint8 weights, as FX 1.13 refuses per-channel ConvTranspose weights")


def fx_qconfig_mapping():
    from torch.ao.quantization import QConfig, default_weight_observer, get_default_qconfig_mapping
    mapping = get_default_qconfig_mapping("onednn")
    act = mapping.global_qconfig.activation
    return mapping.set_object_type(torch.nn.ConvTranspose2d, QConfig(activation=act, weight=default_weight_observer))


def sqnr_db(ref, x):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()))


def write_int8_reference(name, model, calib, evals, config):
    """<name>_int8.safetensors (the weights are <name>.safetensors'): "calib" (FX and dbrq calibrate
    on its batches of CALIB_BATCH in order), "eval", "fp32" (float64 reference output on eval), "fx"
    (PyTorch FX's int8 output, dequantized: prepare_fx / convert_fx, onednn engine); metadata
    fx_sqnr_db (10 log10 of fp32's energy over the error's), the converted FX code and qconfig."""
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.backends.quantized.engine = "onednn"
    model.eval()
    prepared = prepare_fx(copy.deepcopy(model), fx_qconfig_mapping(), example_inputs=(calib[:1],))
    with torch.no_grad():
        for i in range(0, calib.shape[0], CALIB_BATCH):
            prepared(calib[i:i + CALIB_BATCH])
    converted = convert_fx(prepared)
    fp32 = reference_output(model, evals)
    with torch.no_grad():
        fx = converted(evals)
    sq = sqnr_db(fp32, fx)
    path = os.path.join(GOLDEN_DIR, f"{name}_int8.safetensors")
    metadata = {"config": json.dumps(config, sort_keys=True), "torch": torch.__version__, "fx_sqnr_db": f"{sq:.4f}",
                "fx_code": converted.code, "qconfig": FX_QCONFIG_NOTE, "engine": torch.backends.quantized.engine}
    write_safetensors(path, [("calib", calib), ("eval", evals), ("fp32", fp32), ("fx", fx)], metadata)
    print(f"{name}_int8: {os.path.getsize(path)} bytes, calib {list(calib.shape)}, eval {list(evals.shape)}, "
          f"FX SQNR {sq:.2f} dB")


# ---------------------------------------------------------------------------------------------
# main


def main():
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    torch.set_num_threads(1)  # deterministic reductions

    # Full-size key checks: the C++ models must match these exactly.
    tv_resnet = torchvision.models.resnet18()
    tv_mobilenet = torchvision.models.mobilenet_v2()
    assert key_shapes(ResNet18W(64, 1000)) == key_shapes(tv_resnet), "ResNet18W(64) differs from torchvision"
    assert key_shapes(MobileNetV2(num_classes=1000, width_mult=1.0)) == key_shapes(tv_mobilenet)
    with open(os.path.join(GOLDEN_DIR, "torchvision_keys.txt"), "w") as f:
        f.write(f"# torchvision {torchvision.__version__} state-dict keys: model key dtype dims...\n")
        f.write("# Generated by tests/models/make_model_goldens.py; do not edit.\n")
        for model_name, model in (("resnet18", tv_resnet), ("mobilenet_v2", tv_mobilenet)):
            for k, dtype, shape in key_shapes(model):
                f.write(" ".join([model_name, k, DBRQ_DTYPE_NAMES[dtype]] + [str(d) for d in shape]) + "\n")

    gen = torch.Generator().manual_seed(1234)

    torch.manual_seed(1)
    resnet = ResNet18W(**RESNET_TINY)
    randomize_norms(resnet, gen)
    write_golden("resnet18", resnet, torch.randn(2, 3, 64, 64, generator=gen), RESNET_TINY)

    torch.manual_seed(2)
    mobilenet = MobileNetV2(**MOBILENET_TINY)
    randomize_norms(mobilenet, gen)
    write_golden("mobilenet_v2", mobilenet, torch.randn(2, 3, 64, 64, generator=gen), MOBILENET_TINY)

    torch.manual_seed(3)
    bert = BertEncoder(BERT_TINY)
    randomize_norms(bert, gen)
    ids = torch.randint(0, BERT_TINY["vocab_size"], (2, 16), generator=gen, dtype=torch.int64)
    write_golden("bert_encoder", bert, ids, BERT_TINY)

    torch.manual_seed(4)
    cnn = SmallCnn(**SMALL_CNN)
    randomize_norms(cnn, gen)
    write_golden("small_cnn", cnn, torch.randn(4, 1, 8, 8, generator=gen), SMALL_CNN)

    torch.manual_seed(5)
    decoder = DecoderLM(DECODER_TINY)
    randomize_norms(decoder, gen)
    prompts = [torch.randint(0, DECODER_TINY["vocab_size"], (1, n), generator=gen, dtype=torch.int64)
               for n, _ in DECODER_PROMPTS]
    write_decoder_golden("decoder_lm", decoder, prompts, DECODER_TINY)
    # After the decoder LM, with a generator of its own (so the earlier goldens stay byte-identical). Variable lengths (the GRU's loop
    # ends at each sequence's own length); the batch's longest is shorter than the padded width.
    gen = torch.Generator().manual_seed(4321)
    torch.manual_seed(5)
    gru = GruClassifier(**GRU_TINY)
    ids = gru_classifier_ids(6, GRU_TINY_STEPS, GRU_TINY["vocab_size"], gen)
    ids[:, -2:] = 0  # the model trims the batch to its longest sequence
    write_golden("gru_classifier", gru, ids, GRU_TINY)
    write_gru_int8_references(gru, gen)
    # After the GRU classifier, with a generator of its own (earlier goldens stay byte-identical).
    gen = torch.Generator().manual_seed(5678)
    torch.manual_seed(6)
    vit = VisionTransformer(VIT_TINY)
    randomize_norms(vit, gen)
    hw = VIT_TINY["image_size"]
    write_golden("vit", vit, torch.randn(2, 3, hw, hw, generator=gen), VIT_TINY)
    write_vit_int8_references(vit, gen)

    # Issue 12's models, each with a generator of its own (earlier goldens stay byte-identical).
    gen = torch.Generator().manual_seed(1212)
    torch.manual_seed(12)
    dcgan = DcganGenerator(**DCGAN_TINY)
    randomize_norms(dcgan, gen)
    write_golden("dcgan_generator", dcgan, torch.randn(3, DCGAN_TINY["nz"], 1, 1, generator=gen), DCGAN_TINY)
    write_int8_reference("dcgan_generator", dcgan, torch.randn(32, DCGAN_TINY["nz"], 1, 1, generator=gen),
                         torch.randn(16, DCGAN_TINY["nz"], 1, 1, generator=gen), DCGAN_TINY)

    torch.manual_seed(13)
    unet = UNet(**UNET_TINY)
    randomize_norms(unet, gen)
    hw = UNET_TINY_HW
    write_golden("unet", unet, torch.randn(2, 3, hw, hw, generator=gen), UNET_TINY)
    write_int8_reference("unet", unet, smooth_images(8, 3, hw, gen), smooth_images(4, 3, hw, gen), UNET_TINY)

    torch.manual_seed(14)
    kws = KwsConv1d(**KWS_TINY)
    randomize_norms(kws, gen)
    c = KWS_TINY["n_mfcc"]
    write_golden("kws_conv1d", kws, torch.randn(3, c, KWS_FRAMES, generator=gen), KWS_TINY)
    write_int8_reference("kws_conv1d", kws, mfcc_like(16, c, KWS_FRAMES, gen), mfcc_like(32, c, KWS_FRAMES, gen),
                         KWS_TINY)

    # DenseNet (pre-activation dense blocks), last and with its own generator: earlier goldens stay
    # byte-identical. Its full-size keys are torchvision's densenet121's (checked here and in C++).
    tv_densenet = torchvision.models.densenet121()
    assert key_shapes(densenet()) == key_shapes(tv_densenet), "densenet() differs from torchvision's densenet121"
    with open(os.path.join(GOLDEN_DIR, "torchvision_keys.txt"), "a") as f:
        for k, dtype, shape in key_shapes(tv_densenet):
            f.write(" ".join(["densenet121", k, DBRQ_DTYPE_NAMES[dtype]] + [str(d) for d in shape]) + "\n")
    gen = torch.Generator().manual_seed(5678)
    torch.manual_seed(6)
    dense = densenet(**DENSENET_TINY)
    randomize_norms(dense, gen)
    write_golden("densenet", dense, torch.randn(2, 3, 32, 32, generator=gen), DENSENET_TINY)


if __name__ == "__main__":
    main()
