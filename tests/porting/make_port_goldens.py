#!/usr/bin/python3
"""Regenerates tests/porting/golden/libtorch_ports.safetensors: the PyTorch twins of the libtorch C++
frontend models ported verbatim in tests/porting/libtorch_models.h (libtorch's DCGAN example
generator and discriminator, and a small ResNet of BasicBlocks written as torchvision's C++ port
writes it), read by tests/porting/verbatim_port_test.cc.

Run with Debian's interpreter (python3-torch 1.13), from anywhere:

    /usr/bin/python3 tests/porting/make_port_goldens.py

Weights are not stored: both sides fill every state_dict tensor from a formula of its name (see
fill() here and FillDeterministic in the test), so the file holds only, per model m:

    m.input    the input (seeded randn)
    m.output   the model's eval-mode output, computed in float64 from the same f32 weights
"""

import math
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from torch_zoo import write_safetensors  # noqa: E402

OUT_PATH = os.path.join(HERE, "golden", "libtorch_ports.safetensors")


def fill(model):
    """Keep in sync with FillDeterministic in verbatim_port_test.cc: tensor j of the state_dict's
    names in sorted order, element i (row-major), v = sin(0.37 i + 0.71 j + 0.05)."""
    sd = model.state_dict()
    names = sorted(k for k in sd if not k.endswith("num_batches_tracked"))
    with torch.no_grad():
        for j, name in enumerate(names):
            t = sd[name]
            v = torch.tensor([math.sin(0.37 * i + 0.71 * j + 0.05) for i in range(t.numel())], dtype=torch.float64)
            if name.endswith("running_var"):
                v = 0.6 + 0.4 * v * v
            elif t.dim() >= 2:
                v = v * (1.5 / math.sqrt(t.numel() / t.shape[0]))
            elif name.endswith("weight"):
                v = 1.0 + 0.1 * v
            else:
                v = 0.1 * v
            t.copy_(v.to(torch.float32).reshape(t.shape))


class DCGANGenerator(nn.Module):
    def __init__(self, noise_size):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(noise_size, 256, 4, bias=False)
        self.conv2 = nn.ConvTranspose2d(256, 128, 3, stride=2, padding=1, bias=False)
        self.conv3 = nn.ConvTranspose2d(128, 64, 4, stride=2, padding=1, bias=False)
        self.conv4 = nn.ConvTranspose2d(64, 1, 4, stride=2, padding=1, bias=False)
        self.batch_norm1 = nn.BatchNorm2d(256)
        self.batch_norm2 = nn.BatchNorm2d(128)
        self.batch_norm3 = nn.BatchNorm2d(64)

    def forward(self, x):
        x = torch.relu(self.batch_norm1(self.conv1(x)))
        x = torch.relu(self.batch_norm2(self.conv2(x)))
        x = torch.relu(self.batch_norm3(self.conv3(x)))
        return torch.tanh(self.conv4(x))


def discriminator():
    return nn.Sequential(
        nn.Conv2d(1, 64, 4, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(128), nn.LeakyReLU(0.2),
        nn.Conv2d(128, 256, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(256), nn.LeakyReLU(0.2),
        nn.Conv2d(256, 1, 3, stride=1, padding=0, bias=False), nn.Sigmoid())


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return torch.relu(out)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        self.layer2 = nn.Sequential(
            BasicBlock(16, 32, 2, nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))),
            BasicBlock(32, 32))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = x.view(x.size(0), -1)
        return self.fc(x)


def run(model, x):
    fill(model)
    model.eval()
    with torch.no_grad():
        return model.double()(x.double()).float()


def main():
    torch.manual_seed(12)
    out = []
    noise = torch.randn(2, 100, 1, 1)
    fake = run(DCGANGenerator(100), noise)
    out += [("generator.input", noise), ("generator.output", fake)]
    images = torch.tanh(torch.randn(2, 1, 28, 28))
    out += [("discriminator.input", images), ("discriminator.output", run(discriminator(), images))]
    x = torch.randn(2, 3, 16, 16)
    out += [("resnet.input", x), ("resnet.output", run(TinyResNet(10), x))]
    os.makedirs(os.path.dirname(OUT_PATH), exist_ok=True)
    write_safetensors(OUT_PATH, [(k, v.contiguous()) for k, v in out])
    print("wrote", OUT_PATH)


if __name__ == "__main__":
    main()
