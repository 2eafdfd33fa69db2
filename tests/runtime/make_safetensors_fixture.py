#!/usr/bin/python3
"""Writes the safetensors fixtures that tests/runtime/safetensors_test.cc reads.

Run with Debian's Python, which has torch 1.13 (the python3 first on PATH may not):

    /usr/bin/python3 tests/runtime/make_safetensors_fixture.py tests/runtime/data

There is no safetensors Python package here, so the file is written by hand following the format:
an 8-byte little-endian header length, a JSON header (padded with spaces to a multiple of 8 bytes,
as the reference writer does) and the raw little-endian tensor bytes taken from torch.

Files:
  dtypes.safetensors       one small tensor per dtype (F32, F16, BF16, I64, I32, U8, I8), a 0-D
                           and an empty tensor, and __metadata__. Values are fixed literals so the
                           C++ test can spell them out.
  torch_module.safetensors the state_dict of a tiny torch Conv2d -> BatchNorm2d -> ReLU -> flatten
                           -> Linear model (PyTorch key names, F32 and F16 weights, I64
                           num_batches_tracked), an input "input" and the model's output "expected".
"""
import json
import os
import struct
import sys

import torch


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.int8: "I8",
}


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor); data is written in list order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name, t in tensors:
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    # Header keys sorted, so the header order differs from the data order the loader must follow.
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_dtypes(path):
    tensors = [
        ("f32", torch.tensor([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], dtype=torch.float32)),
        # 65504: largest half; 2**-14: smallest normal; 2**-24: smallest subnormal.
        ("f16", torch.tensor([1.5, -2.0, 65504.0, 2.0**-14, 2.0**-24, float("inf")], dtype=torch.float16)),
        ("bf16", torch.tensor([1.0, -3.140625, 256.0], dtype=torch.bfloat16)),
        ("i64", torch.tensor([[-(2**40), 0], [1, 2**62]], dtype=torch.int64)),
        ("i32", torch.tensor([-(2**31), 0, 2**31 - 1], dtype=torch.int32)),
        ("u8", torch.tensor([0, 1, 128, 255], dtype=torch.uint8)),
        ("i8", torch.tensor([-128, -1, 0, 127], dtype=torch.int8)),
        ("scalar", torch.tensor(3.25, dtype=torch.float32)),
        # Non-contiguous in torch (a transpose); stored contiguous like safetensors.torch does.
        ("transposed", torch.arange(6, dtype=torch.float32).reshape(2, 3).t()),
        ("empty", torch.zeros(0, 3, dtype=torch.float32)),
    ]
    write_safetensors(path, tensors, {"format": "pt", "producer": "make_safetensors_fixture.py"})


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 3 * 3, 2)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


def write_module(path):
    torch.manual_seed(0)
    m = Tiny()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.2, 0.2)
        m.bn.num_batches_tracked.fill_(7)
        # The linear weight travels as F16: round it first so the model output matches what a
        # loader that converts F16 to F32 computes.
        m.fc.weight.copy_(m.fc.weight.half().float())
    m.eval()
    x = torch.randn(1, 2, 3, 3)
    with torch.no_grad():
        y = m(x)
    tensors = []
    for name, t in m.state_dict().items():
        tensors.append((name, t.half() if name == "fc.weight" else t))
    tensors.append(("input", x))
    tensors.append(("expected", y))
    write_safetensors(path, tensors, {"format": "pt"})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    os.makedirs(out, exist_ok=True)
    write_dtypes(os.path.join(out, "dtypes.safetensors"))
    write_module(os.path.join(out, "torch_module.safetensors"))


if __name__ == "__main__":
    main()
