"""The PyTorch variants bench/yardstick.sh puts beside loom, shared by
bench/torch_convnet.py and bench/torch_resnet.py. Reference only: loom's
build and tests never import torch.

  eager      fp32, contiguous (NCHW) tensors: what a plain training loop runs
  bf16       eager under torch.autocast("cpu", dtype=torch.bfloat16)
  compile    torch.compile(model) (default mode), fp32
  cl         eager fp32, model and inputs in channels-last (NHWC) memory
  compile-cl torch.compile with channels-last
"""
import resource
import time

import torch

MODES = ["eager", "bf16", "compile", "cl", "compile-cl"]


def prepare(model, mode):
    """(module to call for training, input converter, autocast context)."""
    cl = mode.endswith("cl")
    if cl:
        model = model.to(memory_format=torch.channels_last)
    fwd = torch.compile(model) if mode.startswith("compile") else model

    def conv(x):
        return x.contiguous(memory_format=torch.channels_last) if cl else x

    def ctx():
        if mode == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    return fwd, conv, ctx


def peak_rss_mib():
    """Peak resident memory of this process so far, MiB (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Clock:
    """Wall and process CPU seconds between start() and stop()."""

    def start(self):
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def stop(self):
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0
        return self


def versions():
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads"
