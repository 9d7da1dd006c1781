#!/usr/bin/python3
"""PyTorch twin of bench/bench_resnet.c for ResNet-50 (no torchvision needed):
the same bottleneck model as examples/models.c (stride on the 3x3 conv), SGD
lr 0.1 momentum 0.9 weight decay 1e-4, random images and labels, timed
training steps after warm-up. Reference only: loom's tests never import torch.

usage: torch_resnet.py [--batch-size 16] [--size 224] [--steps 5] [--warmup 1] [--threads 2]
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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


class ResNet50(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for stage, n in enumerate([3, 4, 6, 3]):
            width = 64 << stage
            for b in range(n):
                layers.append(Bottleneck(cin, width, 2 if b == 0 and stage > 0 else 1))
                cin = 4 * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        h = self.layers(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = ResNet50(1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.rand(a.batch_size, 3, a.size, a.size) * 2 - 1
    y = torch.randint(0, 1000, (a.batch_size,))
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(f"torch resnet50: {a.steps * a.batch_size / dt:.1f} img/s "
          f"(batch {a.batch_size}, {a.size}x{a.size}, {a.steps} steps, {a.threads} threads)")


if __name__ == "__main__":
    main()
