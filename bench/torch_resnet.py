#!/usr/bin/python3
"""PyTorch twin of bench/bench_resnet.c for ResNet-18 and ResNet-50, the same
models as examples/models.c (written out, not torchvision's, so that both
engines train the same layers: bottlenecks with the stride on the 3x3 conv;
at size <= 64 a 3x3 stem without max-pool and 10 classes), SGD lr 0.1
momentum 0.9 weight decay 1e-4, random images and labels, timed training
steps after warm-up (which also compiles, in the compiled modes).
Reference only: loom's tests never import torch.

usage: torch_resnet.py [--depth 50] [--batch-size 16] [--size 224] [--steps 5]
                       [--warmup 1] [--threads 2] [--mode eager|bf16|compile|cl|compile-cl]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_modes  # noqa: E402


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, 4 * width, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.down = None
        if stride != 1 or cin != 4 * width:
            self.down = nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False),
                                      nn.BatchNorm2d(4 * width))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.down = None
        if stride != 1 or cin != width:
            self.down = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False),
                                      nn.BatchNorm2d(width))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.down(x) if self.down is not None else x))


Bottleneck.expansion = 4


class ResNet(nn.Module):
    def __init__(self, depth, size, classes):
        super().__init__()
        block, blocks = (Bottleneck, [3, 4, 6, 3]) if depth == 50 else \
            (Basic, [2, 2, 2, 2] if depth == 18 else [3, 4, 6, 3])
        self.small = size <= 64
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False) if self.small else \
            nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for stage, n in enumerate(blocks):
            width = 64 << stage
            for b in range(n):
                layers.append(block(cin, width, 2 if b == 0 and stage > 0 else 1))
                cin = block.expansion * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        if not self.small:
            h = F.max_pool2d(h, 3, 2, 1)
        h = self.layers(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, choices=[18, 34, 50], default=50)
    ap.add_argument("--mode", choices=torch_modes.MODES, default="eager")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    classes = 10 if a.size <= 64 else 1000
    model = ResNet(a.depth, a.size, classes)
    fwd, conv, ctx = torch_modes.prepare(model, a.mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = conv(torch.rand(a.batch_size, 3, a.size, a.size) * 2 - 1)
    y = torch.randint(0, classes, (a.batch_size,))
    clock = torch_modes.Clock()
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            clock.start()
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
    clock.stop()
    n = a.steps * a.batch_size
    print(f"torch resnet{a.depth}: {n / clock.wall:.2f} img/s, {n / clock.cpu:.2f} img/s per CPU-second, "
          f"peak RSS {torch_modes.peak_rss_mib():.0f} MiB "
          f"(batch {a.batch_size}, {a.size}x{a.size}, {a.steps} steps, {a.mode}, {torch_modes.versions()})")


if __name__ == "__main__":
    main()
