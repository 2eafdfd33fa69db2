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

It also writes torchvision_keys.txt: the ordered state-dict keys, dtypes and shapes of full-size
torchvision.models.resnet18() and mobilenet_v2(), one "model key dtype dims..." line per tensor.

ResNet-18 at reduced width uses torchvision's own BasicBlock, _make_layer and forward; only the
hard-coded 64 of ResNet.__init__ is replaced (and the script asserts that width 64 reproduces
torchvision.models.resnet18() key for key). MobileNetV2 is torchvision's class, which takes
width_mult itself. The BERT encoder and SmallCnn are written here, mirroring samples/zoo.

The safetensors files are written by hand (Debian has no safetensors package): an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, the raw bytes.
"""

import json
import math
import os
import struct

import torch
import torchvision
from torch import nn
from torchvision.models.mobilenetv2 import MobileNetV2
from torchvision.models.resnet import BasicBlock, ResNet

HERE = os.path.dirname(os.path.abspath(__file__))
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

DTYPE_NAMES = {torch.float32: "F32", torch.int64: "I64"}
DBRQ_DTYPE_NAMES = {torch.float32: "f32", torch.int64: "s64"}


# ---------------------------------------------------------------------------------------------
# safetensors writer


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor) in file order; metadata: str -> str."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        data = t.numpy().tobytes()  # native order; x86 is little-endian as the format requires
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Readers may expect the data to start 8-byte aligned; the format pads the header with spaces.
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# models


class ResNet18W(ResNet):
    """torchvision's ResNet-18 with the base width (64) as a parameter."""

    def __init__(self, base_width=64, num_classes=1000):
        nn.Module.__init__(self)
        # The attributes torchvision's _make_layer reads.
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = base_width
        self.dilation = 1
        self.groups = 1
        self.base_width = 64  # BasicBlock insists on 64; it is not the channel count
        w = base_width
        self.conv1 = nn.Conv2d(3, w, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(BasicBlock, w, 2)
        self.layer2 = self._make_layer(BasicBlock, 2 * w, 2, stride=2)
        self.layer3 = self._make_layer(BasicBlock, 4 * w, 2, stride=2)
        self.layer4 = self._make_layer(BasicBlock, 8 * w, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * w, num_classes)


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        positions = torch.arange(seq, dtype=torch.long)
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

    def split_heads(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden):
        q = self.split_heads(self.query(hidden))
        k = self.split_heads(self.key(hidden))
        v = self.split_heads(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(torch.softmax(scores, -1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3)
        return context.reshape(hidden.shape[0], hidden.shape[1], self.num_heads * self.head_size)


class BertResidualOutput(nn.Module):
    """HuggingFace's BertSelfOutput / BertOutput."""

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
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertLayerStack(c)

    def forward(self, input_ids):
        return self.encoder(self.embeddings(input_ids))


class SmallCnn(nn.Module):
    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.relu3 = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.pool(self.relu2(self.bn2(self.conv2(y))))
        y = self.relu3(self.conv3(y))
        return self.fc(torch.flatten(self.avgpool(y), 1))


# ---------------------------------------------------------------------------------------------
# helpers


def randomize_norms(model, gen):
    """Gives every BatchNorm / LayerNorm non-trivial statistics and affine parameters."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
            elif isinstance(m, nn.LayerNorm):
                shape = m.weight.shape
                m.weight.copy_(torch.rand(shape, generator=gen) * 1.0 + 0.5)
                m.bias.copy_(torch.randn(shape, generator=gen) * 0.1)


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


if __name__ == "__main__":
    main()
