#!/usr/bin/env python3
"""The PyTorch side of loom's safetensors golden (tests/e2e/test_torch_golden.c).

`write` builds the tutorial's ConvNet as PyTorch defines it (layer1 =
Sequential(Conv2d, BatchNorm2d, ReLU, MaxPool2d), layer2 the same, fc),
takes three SGD steps on random data so that the batch norms' running
statistics are not their initial 0 and 1, and writes
  convnet_torch.safetensors        model.state_dict(), as save_file writes it
  convnet_torch_batch.safetensors  "image" [4, 1, 28, 28] and PyTorch's eval-mode
                                   "logits" [4, 10] for it (f32)
Run once; the files are committed. loom's suite never runs Python.

`check FILE` loads a file loom exported (mnist_ddp --export FILE) into the
same model with load_state_dict(strict=True) and prints its eval logits on
the committed batch: the way back.

usage: torch_golden.py write [DIR]          (default tests/e2e/golden)
       torch_golden.py check FILE [DIR]
PyTorch and safetensors from PyPI (e.g. a venv: pip install torch safetensors).
"""
import os
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

BATCH = 4


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2))
        self.layer2 = nn.Sequential(
            nn.Conv2d(16, 32, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(kernel_size=2, stride=2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)

    def forward(self, x):
        out = self.layer2(self.layer1(x))
        return self.fc(out.reshape(out.size(0), -1))


def write(out_dir):
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for _ in range(3):
        x = torch.randn(16, 1, 28, 28)
        y = torch.randint(0, 10, (16,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    image = torch.randn(BATCH, 1, 28, 28)
    with torch.no_grad():
        logits = model(image)
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out_dir, "convnet_torch.safetensors"),
              metadata={"format": "pt", "producer": "tools/torch_golden.py, torch " +
                        torch.__version__})
    save_file({"image": image.contiguous(), "logits": logits.contiguous()},
              os.path.join(out_dir, "convnet_torch_batch.safetensors"))
    print(f"wrote {out_dir}: {len(state)} tensors, torch {torch.__version__}")
    print("logits[0]:", logits[0].tolist())


def check(path, golden_dir):
    model = ConvNet()
    model.load_state_dict(load_file(path), strict=True)
    model.eval()
    batch = load_file(os.path.join(golden_dir, "convnet_torch_batch.safetensors"))
    with torch.no_grad():
        logits = model(batch["image"])
    print(f"{path}: loaded into the PyTorch ConvNet (strict); eval logits on the batch:")
    for row in logits.tolist():
        print(" ".join(f"{v:.6f}" for v in row))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "write":
        write(sys.argv[2] if len(sys.argv) > 2 else "tests/e2e/golden")
    elif len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "tests/e2e/golden")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
