#!/usr/bin/python3
"""PyTorch twin of loom's ConvNet benchmark: the same model, data, optimizer
and batch, timed the same way, so that bench/run_convnet.sh can put both in
one table. Reference only: loom's tests never import torch.

usage: torch_convnet.py speed --steps N [--threads T] [--mode M]
       torch_convnet.py train --epochs E [--threads T] [--mode M] [--max-steps S]
--mode: eager (default), bf16, compile, cl, compile-cl (bench/torch_modes.py).
Compiled modes first run --compile-warmup steps on the first batch and then
restore the initial weights, so the timed epoch does not include compiling.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_modes  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def idx(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split, data):
    for ext in ("", ".gz"):
        p = os.path.join(data, f"{split}-images-idx3-ubyte{ext}")
        if os.path.exists(p):
            x = idx(p)
            y = idx(os.path.join(data, f"{split}-labels-idx1-ubyte{ext}"))
            x = (torch.from_numpy(x.astype(np.float32) / 255.0) - MEAN) / STD
            return x.unsqueeze(1).contiguous(), torch.from_numpy(y.astype(np.int64))
    sys.exit(f"torch_convnet: no {split} files in {data}")


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(1568, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["speed", "train"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=torch_modes.MODES, default="eager")
    ap.add_argument("--max-steps", type=int, default=0, help="train: stop each epoch early")
    ap.add_argument("--compile-warmup", type=int, default=3)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = load("train", a.data)
    model = ConvNet()
    fwd, conv, ctx = torch_modes.prepare(model, a.mode)
    b = a.batch
    if a.mode.startswith("compile"):
        # Compile (forward and backward) outside the timed loop, then
        # start again from the same weights.
        init = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(a.compile_warmup):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(fwd(conv(x[:b])), y[:b]).backward()
            opt.step()
        model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def train_step(xb, yb):
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = F.cross_entropy(fwd(conv(xb)), yb)
        loss.backward()
        opt.step()
        return loss

    def step(i):
        j = (i * b) % (x.shape[0] - b + 1)
        return train_step(x[j:j + b], y[j:j + b])

    if a.mode == "speed":
        model.train()
        for i in range(a.warmup):
            step(i)
        times = []
        c0 = time.process_time()
        t0 = time.perf_counter()
        for i in range(a.steps):
            ts = time.perf_counter()
            step(a.warmup + i)
            times.append(time.perf_counter() - ts)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        med = sorted(times)[len(times) // 2]
        # per CPU-second: what a shared machine's contention disturbs least
        # (with 1 thread; with more it also counts OpenMP's spin-waits)
        print(f"torch speed: {b / med:.0f} img/s median step, {a.steps * b / dt:.0f} img/s mean, "
              f"{a.steps * b / cpu:.0f} img/s per CPU-second "
              f"({a.steps} steps, batch {b}, {torch.get_num_threads()} threads, {a.mode}, "
              f"peak RSS {torch_modes.peak_rss_mib():.0f} MiB)")
        return
    xt, yt = load("t10k", a.data)
    g = torch.Generator().manual_seed(a.seed)
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(x.shape[0], generator=g)
        n = x.shape[0] // b
        if a.max_steps:
            n = min(n, a.max_steps)
        clock = torch_modes.Clock()
        clock.start()
        for i in range(n):
            idx_ = perm[i * b:(i + 1) * b]
            train_step(x[idx_], y[idx_])
        clock.stop()
        dt = clock.wall
        model.eval()
        with torch.no_grad():
            acc = sum((model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
                      for i in range(0, xt.shape[0], 1000)) / xt.shape[0]
        print(f"torch epoch {epoch + 1}: test accuracy {100 * acc:.2f}%, "
              f"{n * b / dt:.0f} img/s, {n * b / clock.cpu:.0f} img/s per CPU-second of the loop "
              f"({a.mode}, {torch_modes.versions()}, peak RSS {torch_modes.peak_rss_mib():.0f} MiB)")


if __name__ == "__main__":
    main()
