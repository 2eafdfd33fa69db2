#!/usr/bin/python3
"""Trains dbrq's zoo SmallCnn on scikit-learn's 8x8 handwritten digits and writes the bundled data.

    /usr/bin/python3 tools/train_digits.py          # Debian's python3 (PyTorch 1.13, scikit-learn)

Writes, under samples/data/:
  digits_small_cnn.safetensors  the trained weights, with the state-dict keys of zoo::SmallCnn
                                (samples/zoo/small_cnn.h), loadable with load_state_dict(strict)
  digits_calib.safetensors      the calibration split: "images" f32 [N, 1, 8, 8], "labels" s64 [N]
  digits_test.safetensors       the held-back test split, same layout

The 1797 images are shuffled once with a fixed seed and split into train / calibration / test; the
calibration and test images are never trained on. Pixels (0..16 in scikit-learn) are normalized as
the model expects them: x / 16, then standardized with the training split's mean and std (both
stored in every file's metadata, so other data can be prepared the same way).

Everything is deterministic (fixed seeds, one thread, deterministic algorithms): rerunning the
script reproduces the files byte for byte on the same PyTorch build. Training takes seconds.

SmallCnn and the safetensors writer are shared with the other PyTorch scripts in torch_zoo.py.
"""

import os
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_zoo import SmallCnn, write_safetensors  # noqa: E402

DATA_DIR = os.path.join(os.path.dirname(HERE), "samples", "data")

SEED = 0
NUM_TEST = 360       # held back: reported accuracy
NUM_CALIB = 256      # int8 calibration; not trained on either
EPOCHS = 12
BATCH_SIZE = 32
LEARNING_RATE = 3e-3

# Keys zoo::SmallCnn's state_dict() has, in its order (parameters then buffers of each module).
EXPECTED_KEYS = [
    "conv1.weight",
    "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
    "conv2.weight",
    "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked",
    "conv3.weight", "conv3.bias",
    "fc.weight", "fc.bias",
]


def accuracy(model, images, labels):
    model.eval()
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


def load_splits():
    """Seeds torch, and returns the normalized splits: mean, std, and (images, labels) for the
    train, calibration and test parts (the test part is held back; calibration is not trained on)."""
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0          # [1797, 8, 8] in [0, 1]
    labels = digits.target.astype(np.int64)
    order = np.random.RandomState(SEED).permutation(len(labels))
    test_idx = order[:NUM_TEST]
    calib_idx = order[NUM_TEST:NUM_TEST + NUM_CALIB]
    train_idx = order[NUM_TEST + NUM_CALIB:]

    mean = float(images[train_idx].mean())
    std = float(images[train_idx].std())

    def split(idx):
        x = torch.from_numpy((images[idx] - mean) / std).reshape(-1, 1, 8, 8).contiguous()
        return x.float(), torch.from_numpy(labels[idx])

    return mean, std, split(train_idx), split(calib_idx), split(test_idx)


def fit(model, x_train, y_train, epochs, describe=lambda model: ""):
    """Adam + cosine schedule, seeded shuffles, cross-entropy; prints the loss (and `describe`) per epoch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    gen = torch.Generator().manual_seed(SEED)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(y_train), generator=gen)
        total = 0.0
        for i in range(0, len(perm), BATCH_SIZE):
            b = perm[i:i + BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[b]), y_train[b])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(b)
        scheduler.step()
        print(f"epoch {epoch + 1:2d}/{epochs}: loss {total / len(y_train):.4f}{describe(model)}")
    model.eval()


def main():
    mean, std, (x_train, y_train), (x_calib, y_calib), (x_test, y_test) = load_splits()

    model = SmallCnn()
    keys = list(model.state_dict().keys())
    if keys != EXPECTED_KEYS:
        sys.exit(f"state-dict keys differ from zoo::SmallCnn's: {keys}")

    fit(model, x_train, y_train, EPOCHS,
        lambda m: f", calibration-split accuracy {accuracy(m, x_calib, y_calib) * 100:.2f}%")

    model.eval()
    train_acc = accuracy(model, x_train, y_train)
    test_acc = accuracy(model, x_test, y_test)
    print(f"PyTorch fp32 accuracy: train {train_acc * 100:.2f}% ({len(y_train)} images), "
          f"test {test_acc * 100:.2f}% ({len(y_test)} held-back images)")
    if test_acc < 0.95:
        sys.exit(f"test accuracy {test_acc:.4f} is below 0.95; not writing files")

    os.makedirs(DATA_DIR, exist_ok=True)
    common = {
        "source": "sklearn.datasets.load_digits, written by tools/train_digits.py",
        "normalization": "x = (pixel / 16 - mean) / std",
        "mean": repr(mean),
        "std": repr(std),
        "seed": str(SEED),
    }
    weights_path = os.path.join(DATA_DIR, "digits_small_cnn.safetensors")
    write_safetensors(weights_path, list(model.state_dict().items()),
                      dict(common, model="small_cnn", torch_test_accuracy=f"{test_acc:.6f}",
                           torch_version=torch.__version__))
    for name, x, y in (("calib", x_calib, y_calib), ("test", x_test, y_test)):
        path = os.path.join(DATA_DIR, f"digits_{name}.safetensors")
        write_safetensors(path, [("images", x), ("labels", y)], dict(common, split=name))
    total_bytes = 0
    for f in sorted(os.listdir(DATA_DIR)):
        if f.endswith(".safetensors"):
            size = os.path.getsize(os.path.join(DATA_DIR, f))
            total_bytes += size
            print(f"wrote samples/data/{f} ({size} bytes)")
    print(f"total {total_bytes} bytes")


if __name__ == "__main__":
    main()
