#!/usr/bin/env python3
"""The PyTorch side of the GPU benchmark (issue 13): the workloads loom is
measured on, run the way PyTorch users run them, so bench/gpu_side_by_side.sh
can print one table with loom beside it from the same call on the same GPU.

Modes (each prints one JSON object per line on stdout, a readable line on
stderr):
  eager-fp32    plain fp32 (cuDNN convolutions on TF32, PyTorch's default)
  exact-fp32    plain fp32 with TF32 off (cudnn.allow_tf32 and
                cuda.matmul.allow_tf32 False): the twin of loom's --tf32 off
  amp-fp16      torch.autocast(float16) + GradScaler (apex O1's successor)
  amp-bf16      torch.autocast(bfloat16), no scaler
  compile-fp16  torch.compile of the amp-fp16 step, when torch has it
  compile-eager-fp32, compile-amp-fp16, compile-amp-bf16
                the mode after "compile-" with torch.compile(model,
                mode=--compile-mode): "reduce-overhead" (CUDA graphs, the
                default), "max-autotune" (also searches Triton templates for
                the products and convolutions: minutes more) or "default"
ResNet-50 runs channels_last, as NVIDIA's recipes do (--layout nchw: in
NCHW, as loom's tensors are). Every mode runs --warmup untimed steps
(default 20, at least 10 asked) then --steps timed ones; each JSON line
also gives "flop_per_img" (the products' FLOPs of one image's forward and
backward, counted once by torch.utils.flop_counter) and "mfu" against
--peak-flops, by default on CUDA the H100/H200 SXM dense peak of the
mode's product type: 989 TFLOP/s fp16/bf16, 494.5 TF32, 66.9 exact fp32.

usage: torch_gpu.py convnet [--batch 100] [--modes ...] [--data DIR]
       torch_gpu.py resnet50 [--batch 128] [--modes ...] [--layout channels-last|nchw]
       add --device cpu --steps 3 for a smoke run on a machine without a GPU.
Reference only: loom's tests never import torch.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_convnet import ConvNet, load, DATA  # noqa: E402  (the same model as the CPU twin)


def resnet50():
    try:
        import torchvision
        return torchvision.models.resnet50(num_classes=1000)
    except ImportError:
        sys.exit("torch_gpu: resnet50 needs torchvision")


# The H100/H200 SXM dense peaks (NVIDIA's data sheet) by the type the
# products run in: what "mfu" is measured against unless --peak-flops.
PEAK = {"fp16": 989e12, "bf16": 989e12, "tf32": 494.5e12, "fp32": 66.9e12}


def product_type(mode):
    if mode.endswith("fp16"):
        return "fp16"
    if mode.endswith("bf16"):
        return "bf16"
    return "fp32" if mode == "exact-fp32" else "tf32"


def flop_per_img(model_fn, device, fmt):
    """The products' FLOPs (forward and backward) of one image, counted by
    torch.utils.flop_counter on a fresh model at batch 2; None where this
    torch has no counter."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    m = model_fn().to(device).to(memory_format=fmt)
    x = torch.randn(2, 3, 224, 224, device=device).to(memory_format=fmt)
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(m(x), torch.zeros(2, dtype=torch.long, device=device)).backward()
    return counter.get_total_flops() / 2


def make_step(model, opt, mode, device, compile_mode="reduce-overhead"):
    """One training step as its mode runs it; returns step(x, y) -> loss."""
    if mode.startswith("compile-") and mode != "compile-fp16":
        # torch.compile(model) in the mode's twin: the way users compile.
        if not hasattr(torch, "compile"):
            return None
        model = torch.compile(model, mode=compile_mode)
        mode = mode[len("compile-"):]
    half = {"amp-fp16": torch.float16, "compile-fp16": torch.float16,
            "amp-bf16": torch.bfloat16}.get(mode)
    on = half == torch.float16 and device == "cuda"
    # torch.amp.GradScaler("cuda") where this torch has it (2.3+; the
    # older spelling warns there).
    scaler = (torch.amp.GradScaler("cuda", enabled=on) if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=on))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        # CPU autocast takes bf16 only; a disabled context still wants a dtype
        # the device accepts.
        on = half is not None and (device == "cuda" or half == torch.bfloat16)
        with torch.autocast(device_type=device, dtype=half if on else torch.bfloat16, enabled=on):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    if mode.startswith("compile"):
        if not hasattr(torch, "compile"):
            return None
        return torch.compile(step)
    return step


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(model, opt, mode, device, batches, steps, warmup, compile_mode="reduce-overhead"):
    step = make_step(model, opt, mode, device, compile_mode)
    if step is None:
        return None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup):
        step(*batches[i % len(batches)])
    sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(*batches[i % len(batches)])
    sync(device)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return {"img_per_s": steps * batches[0][0].shape[0] / dt, "peak_bytes": peak,
            "loss": float(loss.detach())}


def time_to_accuracy(device, mode, batch, data, target=0.90, max_epochs=20):
    """Seconds of training (evaluation excluded) until the test accuracy
    reaches target, evaluated once per epoch; None if it never does."""
    torch.manual_seed(0)
    x, y = load("train", data)
    xt, yt = load("t10k", data)
    x, y, xt, yt = x.to(device), y.to(device), xt.to(device), yt.to(device)
    model = ConvNet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = make_step(model, opt, mode, device)
    if step is None:
        return None
    spent = 0.0
    for epoch in range(max_epochs):
        perm = torch.randperm(x.shape[0], device=device)
        model.train()
        sync(device)
        t0 = time.perf_counter()
        for i in range(x.shape[0] // batch):
            idx = perm[i * batch:(i + 1) * batch]
            step(x[idx], y[idx])
        sync(device)
        spent += time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            acc = sum((model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
                      for i in range(0, xt.shape[0], 1000)) / xt.shape[0]
        if acc >= target:
            return {"seconds": spent, "epochs": epoch + 1, "accuracy": acc}
    return {"seconds": None, "epochs": max_epochs, "accuracy": acc}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=["convnet", "resnet50"])
    ap.add_argument("--batch", type=int)
    ap.add_argument("--modes", nargs="+",
                    default=["eager-fp32", "amp-fp16", "amp-bf16", "compile-fp16"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layout", choices=["channels-last", "nchw"], default="channels-last",
                    help="resnet50: the memory format of the model and the batch")
    ap.add_argument("--compile-mode", default="reduce-overhead",
                    choices=["default", "reduce-overhead", "max-autotune",
                             "max-autotune-no-cudagraphs"],
                    help="torch.compile's mode for the compile-eager-fp32/-amp-* modes")
    ap.add_argument("--peak-flops", type=float,
                    help="FLOP/s for MFU (default on CUDA: the mode's H100/H200 dense peak)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--time-to-accuracy", action="store_true",
                    help="convnet: also train to 90%% test accuracy per mode")
    a = ap.parse_args()
    dev = a.device
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if a.layout == "channels-last" else torch.contiguous_format
    tf32_default = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    flop = None
    if a.model == "resnet50":
        flop = flop_per_img(resnet50, dev, fmt)
    for mode in a.modes:
        torch.manual_seed(0)
        exact = mode == "exact-fp32"
        torch.backends.cudnn.allow_tf32 = False if exact else tf32_default[0]
        torch.backends.cuda.matmul.allow_tf32 = False if exact else tf32_default[1]
        if a.model == "convnet":
            b = a.batch or 100
            model = ConvNet().to(dev)
            x, y = load("train", a.data)
            batches = [(x[i * b:(i + 1) * b].to(dev), y[i * b:(i + 1) * b].to(dev))
                       for i in range(8)]
        else:
            b = a.batch or 128
            model = resnet50().to(dev).to(memory_format=fmt)
            # The mock loader of the classic DataParallel notebook: one fixed
            # random batch that lives on the device.
            xb = torch.randn(b, 3, 224, 224, device=dev).to(memory_format=fmt)
            batches = [(xb, torch.randint(0, 1000, (b,), device=dev))]
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        r = measure(model, opt, mode, dev, batches, a.steps, a.warmup, a.compile_mode)
        row = {"side": "torch " + torch.__version__, "model": a.model, "batch": b, "mode": mode,
               "device": gpu, "warmup": a.warmup, "steps": a.steps}
        if mode.startswith("compile-") and mode != "compile-fp16":
            row["compile_mode"] = a.compile_mode
        if a.model == "resnet50":
            row["layout"] = a.layout
        peak = a.peak_flops or (PEAK[product_type(mode)] if dev == "cuda" else None)
        if r is not None and flop:
            r["flop_per_img"] = flop
            if peak:
                r["mfu"] = round(100.0 * r["img_per_s"] * flop / peak, 2)
                r["peak_flops"] = peak
        if r is None:
            row["skipped"] = "torch.compile is not in this torch"
        else:
            row.update(r)
            if a.model == "convnet" and a.time_to_accuracy:
                row["to_90"] = time_to_accuracy(dev, mode, b, a.data)
        print(json.dumps(row), flush=True)
        if r:
            mfu = f", MFU {r['mfu']:.1f}%" if "mfu" in r else ""
            print(f"torch {a.model} b{b} {mode}: {r['img_per_s']:.0f} img/s{mfu}, "
                  f"peak {r['peak_bytes'] / 2**20:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
