#!/usr/bin/env python3
"""tests/engine/cuda/gpu_versus.py — the GPU suite's versus table: loom
beside what users run (PyTorch the nanoGPT way and channels-last, eager and
compiled; llm.c's train_gpt2cu), one row per workload, PyTorch's best mode
beside loom, every MFU against one peak and one FLOP count per workload.

usage: gpu_versus.py VERSUS [--device NAME] [--peak-half F] [--peak-tf32 F]
where each line of VERSUS is
  workload <TAB> side <TAB> run name <TAB> kind <TAB> log
workload: gpt2_124m_b<B>_t<T>_<bf16|fp16|fp32> or r50_b<B>_<fp16|bf16|fp32>
side: loom, torch or llmc; kinds (what the log holds):
  loom_tok   gpt_ddp: the last "step ... X tok/s" line (its last interval)
  torch_tok  bench/torch_gpt.py: the first "torch ... X tok/s" line
  llmc_tok   train_gpt2cu: B*T over the mean of its per-step "| X ms |"
             after step 10 (after step 1 in a shorter run)
  loom_img   resnet50_synthetic: "total: X img/s"
  torch_img  bench/torch_gpu.py: each JSON line whose mode runs the
             workload's type (fp32: eager-fp32 and compile-eager-fp32, TF32)
A run without its figure is "-" with the log's last line; nothing is made
up. Stdlib only; always exits 0 (the verdicts are gpu_summary.sh's).
"""
import argparse
import json
import os
import re
import sys

# The H100/H200 SXM dense peaks (NVIDIA's data sheet), the MFU's denominator.
PEAK_HALF = 989e12
PEAK_TF32 = 494.5e12
# ResNet-50's products (conv, linear) forward and backward per 224x224
# image: loom's plan and torch.utils.flop_counter agree on it.
R50_FLOP = 24.299077632e9


def gpt2_flop(T, V=50304, L=12, C=768):
    """nanoGPT's estimate_mfu per token: 6N + 12LCT, N the parameters less
    the position table, the table padded to 50304 as nanoGPT and llm.c run."""
    per_layer = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) \
        + (4 * C * C + C)
    n = V * C + L * per_layer + 2 * C
    return 6.0 * n + 12.0 * L * C * T


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
    except OSError:
        return "no log (not run: absent or out of time)"
    return lines[-1][:90] if lines else "empty log"


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def loom_tok(text):
    r = None
    for l in text.splitlines():
        m = re.match(r"^step .* ([0-9][0-9.]*) tok/s", l)
        if m:
            r = float(m.group(1))
    return [("", r)] if r else []


def torch_tok(text):
    for l in text.splitlines():
        m = re.match(r"^torch \S+ (eager|compiled).* ([0-9][0-9.]*) tok/s", l)
        if m:
            return [(m.group(1), float(m.group(2)))]
    return []


def llmc_tok(text, tokens):
    ms = {}
    for l in text.splitlines():
        m = re.match(r"^step +(\d+)/\d+ \|.*\| +([0-9.]+) ms \|", l)
        if m:
            ms[int(m.group(1))] = float(m.group(2))
    if not ms:
        return []
    skip = 10 if max(ms) > 10 else 1
    t = [v for k, v in ms.items() if k > skip] or list(ms.values())
    return [("steps %d-%d" % (skip + 1, max(ms)), tokens * 1e3 / (sum(t) / len(t)))]


def loom_img(text):
    m = re.findall(r"total: ([0-9.]+) img/s", text)
    return [("", float(m[-1]))] if m else []


def torch_img(text, prec):
    want = {"fp16": ("amp-fp16", "compile-amp-fp16", "compile-fp16"),
            "bf16": ("amp-bf16", "compile-amp-bf16"),
            "fp32": ("eager-fp32", "compile-eager-fp32")}[prec]
    out = []
    for l in text.splitlines():
        if not l.startswith("{"):
            continue
        try:
            j = json.loads(l)
        except ValueError:
            continue
        if j.get("mode") not in want:
            continue
        label = j["mode"] + (" (%s)" % j["compile_mode"] if "compile_mode" in j else "")
        if "layout" in j:
            label += ", " + j["layout"]
        out.append((label, j.get("img_per_s"), j.get("skipped")))
    return out


class Workload:
    def __init__(s, name, peak_half, peak_tf32):
        s.name = name
        s.gpt = name.startswith("gpt2")
        m = re.search(r"_b(\d+)", name)
        s.batch = int(m.group(1)) if m else 0
        m = re.search(r"_t(\d+)", name)
        s.T = int(m.group(1)) if m else 1024
        s.prec = name.rsplit("_", 1)[-1]
        s.unit = "tok/s" if s.gpt else "img/s"
        s.flop = gpt2_flop(s.T) if s.gpt else R50_FLOP
        s.peak = peak_tf32 if s.prec == "fp32" else peak_half
        s.runs = []  # (side, run label, rate or None, note)

    def title(s):
        if s.gpt:
            return "GPT-2 124M b%d T%d %s" % (s.batch, s.T, s.prec)
        return "ResNet-50 b%d %s" % (s.batch, "fp32 (TF32)" if s.prec == "fp32" else s.prec)

    def mfu(s, rate):
        return "%.1f%%" % (100.0 * rate * s.flop / s.peak) if rate else "-"

    def best(s, side):
        r = [x for x in s.runs if x[0] == side and x[2]]
        return max(r, key=lambda x: x[2]) if r else None


def run_label(name, side, kind, what):
    """What a reader needs of a run: loom's level, PyTorch's mode, llm.c's
    steps (the run's own name is in the log's file name)."""
    if kind == "torch_img":
        return what
    if kind == "torch_tok":
        return "nanoGPT " + what
    if kind == "llmc_tok":
        return "train_gpt2cu " + what
    tail = name.split("_%s_" % side, 1)[-1] if "_%s_" % side in name else name
    return tail.replace("_", " ") + (" " + what if what else "")


def rate_s(r):
    return "{:,.0f}".format(r) if r and r >= 1000 else ("%.1f" % r if r else "-")


def collect(path, peak_half, peak_tf32):
    works = {}
    with open(path) as f:
        for line in f:
            f5 = line.rstrip("\n").split("\t")
            if len(f5) < 5 or not f5[0]:
                continue
            wname, side, name, kind, log = f5[:5]
            w = works.setdefault(wname, Workload(wname, peak_half, peak_tf32))
            text = read(log)
            if kind == "loom_tok":
                got = loom_tok(text)
            elif kind == "torch_tok":
                got = torch_tok(text)
            elif kind == "llmc_tok":
                got = llmc_tok(text, w.batch * w.T)
            elif kind == "loom_img":
                got = loom_img(text)
            elif kind == "torch_img":
                got = torch_img(text, w.prec)
            else:
                w.runs.append((side, name, None, "unknown kind " + kind))
                continue
            if not got:
                why = last_line(log)
                if kind == "torch_img" and text and not why.startswith(("not run", "no ")):
                    why = "no %s mode finished; last line: %s" % (w.prec, why)
                w.runs.append((side, name, None, why))
            for g in got:
                label = run_label(name, side, kind, g[0])
                note = g[2] if len(g) > 2 and g[2] else ""
                w.runs.append((side, label, g[1], note if not g[1] else ""))
    return list(works.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versus")
    ap.add_argument("--device", default="the GPU")
    ap.add_argument("--peak-half", type=float, default=PEAK_HALF,
                    help="bf16/fp16 dense FLOP/s (default 989e12, H100/H200 SXM)")
    ap.add_argument("--peak-tf32", type=float, default=PEAK_TF32,
                    help="TF32 dense FLOP/s (default 494.5e12)")
    a = ap.parse_args()
    if not os.path.exists(a.versus):
        print("gpu_versus: no %s (the versus section did not run)" % a.versus)
        return 0
    works = collect(a.versus, a.peak_half, a.peak_tf32)
    print("### loom against what users run, on %s" % a.device)
    print()
    print("MFU for every engine alike: GPT-2 %.1f MFLOP per token (nanoGPT's 6N + 12LCT, "
          "table 50304), ResNet-50 %.3f GFLOP per image (products, forward and backward), "
          "against %.1f TFLOP/s bf16/fp16 and %.1f TF32 (dense peaks; an H100/H200 SXM's "
          "unless told otherwise)." % (gpt2_flop(1024) / 1e6, R50_FLOP / 1e9,
                                       a.peak_half / 1e12, a.peak_tf32 / 1e12))
    print()
    print("| workload | loom | rate | MFU | PyTorch's best | rate | MFU | loom / PyTorch "
          "| llm.c | MFU | loom / llm.c |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in works:
        lb, tb, cb = w.best("loom"), w.best("torch"), w.best("llmc")
        ratio = lambda x, y: "%.2fx" % (x[2] / y[2]) if x and y else "-"
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            w.title(), lb[1] if lb else "-", rate_s(lb[2] if lb else None),
            w.mfu(lb[2] if lb else None), tb[1] if tb else "-",
            rate_s(tb[2] if tb else None), w.mfu(tb[2] if tb else None), ratio(lb, tb),
            rate_s(cb[2]) if cb else ("-" if w.gpt else "n/a"),
            w.mfu(cb[2]) if cb else "-", ratio(lb, cb)))
    print()
    print("Every run (rate in tok/s for GPT-2, img/s for ResNet-50):")
    print()
    print("| workload | side | run | rate | MFU | note |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for w in works:
        for side, label, r, note in w.runs:
            print("| %s | %s | %s | %s | %s | %s |" % (w.title(), side, label, rate_s(r),
                                                      w.mfu(r), note.replace("|", "/")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
