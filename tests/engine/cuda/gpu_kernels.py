#!/usr/bin/env python3
"""tests/engine/cuda/gpu_kernels.py — per-kernel GPU time of one training
step, two programs side by side (loom's GPT-2 step and llm.c's), from
kernel summaries (Nsight Systems', or libloom_kprof.so's through CUPTI,
in the same columns: gpu_kprof.sh), as one markdown table: each side's top
kernels grouped by family (matmul, layernorm, attention, gelu, adamw,
embedding, other), each family's total over all its kernels first.

usage: gpu_kernels.py --side NAME LONG.csv STEPS [SHORT.csv STEPS] ... [--top 20]
Each CSV is `nsys stats --report cuda_gpu_kern_sum --format csv` of a run
(columns found by name: "Total Time (ns)", "Instances", "Name"; lines
before the header, as nsys prints them, are skipped). With two runs of a
program (say 5 and 15 steps) a kernel's time per step is the difference
over the difference of steps, so start-up, searches, evaluation and the
first steps cancel; with one run it is the total over its steps (start-up
included: the table says so). Stdlib only.
"""
import argparse
import csv
import re
import sys

FAMILIES = ["matmul", "layernorm", "attention", "gelu", "adamw", "embedding", "other"]

# Tried in this order on the lower-cased name: attention first (cuDNN's and
# flash kernels say sdpa/flash/fmha, never gemm), then products, then the
# rest; a product with a fused epilogue is a product, and so is a bias
# gradient taken outside it (loom's colsum kernels, LOOM_CUDA_BGRAD=kernel;
# llm.c's matmul_backward_bias).
RULES = [
    ("attention", r"flash|fmha|sdpa|attention|attn|scaled_dot|(?<!log_)softmax(?!.*(cross|classif))"
                  r"|permute_kernel|unpermute_kernel"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|matmul|splitk|gemv|wgmma|_tensorop_|sm\d\d_.*_tn|"
               r"dot_kernel|cudnn.*conv|colsum"),
    ("layernorm", r"layer_?norm|layernorm|gammabeta|rmsnorm|ln_fwd|ln_bwd|fused_residual"),
    ("gelu", r"gelu"),
    ("adamw", r"adam|opt_update|fusedadam"),
    ("embedding", r"embedding|encoder_forward|encoder_backward|wte_backward|wpe_backward|"
                  r"indexselect|index_select|embedding_backward|krn_partials|"
                  r"compute_grad_weight|sum_and_scatter"),
]


def family(name):
    n = name.lower()
    for fam, rx in RULES:
        if re.search(rx, n):
            return fam
    return "other"


def read_csv(path):
    """{kernel name: (total ns, instances)} from an nsys kernel summary."""
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    start = None
    for i, l in enumerate(lines):
        if "Name" in l and "Total Time" in l:
            start = i
            break
    if start is None:
        raise SystemExit("gpu_kernels: %s: no kernel summary header (\"Total Time (ns)\", "
                         "\"Name\")" % path)
    rows = list(csv.reader(lines[start:]))
    head = [h.strip() for h in rows[0]]

    def col(rx):
        for i, h in enumerate(head):
            if re.search(rx, h):
                return i
        raise SystemExit("gpu_kernels: %s: no column like %r in %s" % (path, rx, head))

    ti, ni, nm = col(r"^Total Time"), col(r"^Instances|^Calls|^Count"), col(r"^Name$")
    out = {}
    for r in rows[1:]:
        if len(r) <= max(ti, ni, nm) or not r[nm].strip():
            continue
        try:
            t, n = float(r[ti].replace(",", "")), float(r[ni].replace(",", ""))
        except ValueError:
            continue
        a = out.get(r[nm], (0.0, 0.0))
        out[r[nm]] = (a[0] + t, a[1] + n)
    return out


def per_step(spec):
    """A side's kernels per step: {name: (ms, calls)} and how it was got."""
    name, long_csv, long_n = spec[0], spec[1], int(spec[2])
    lo = read_csv(long_csv)
    if len(spec) >= 5:
        sh, sh_n = read_csv(spec[3]), int(spec[4])
        d = long_n - sh_n
        if d <= 0:
            raise SystemExit("gpu_kernels: %s: the long run's steps must exceed the short's"
                             % name)
        k = {}
        for kn in set(lo) | set(sh):
            t = (lo.get(kn, (0, 0))[0] - sh.get(kn, (0, 0))[0]) / d
            c = (lo.get(kn, (0, 0))[1] - sh.get(kn, (0, 0))[1]) / d
            if t > 0:
                k[kn] = (t / 1e6, c)
        how = "(%d - %d steps) / %d" % (long_n, sh_n, d)
    else:
        k = {kn: (v[0] / long_n / 1e6, v[1] / long_n) for kn, v in lo.items() if v[0] > 0}
        how = "%d steps / %d, start-up included" % (long_n, long_n)
    return name, k, how


def short(name, width=64):
    """The name without "void " and its argument list, cut to width."""
    n = name.strip()
    if n.startswith("void "):
        n = n[5:]
    depth = 0
    for i, ch in enumerate(n):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            n = n[:i]
            break
    n = n.replace("|", "/").replace("`", "'")
    return n if len(n) <= width else n[:width - 3] + "..."


def kernels(n):
    return "%d kernel%s" % (n, "" if n == 1 else "s")


def table(sides, top):
    out = []
    heads = " | ".join("%s: kernel | ms/step | calls/step" % s[0] for s in sides)
    out.append("| family | " + heads + " |")
    out.append("| --- |" + " --- | ---: | ---: |" * len(sides))
    picks = []
    for name, k, _ in sides:
        best = sorted(k.items(), key=lambda x: -x[1][0])[:top]
        picks.append({f: [x for x in best if family(x[0]) == f] for f in FAMILIES})
    for f in FAMILIES:
        cells = []
        for (name, k, _), p in zip(sides, picks):
            allf = [v for kn, v in k.items() if family(kn) == f]
            cells.append("%s | **%.3f** | %.0f" % (kernels(len(allf)), sum(v[0] for v in allf),
                                                          sum(v[1] for v in allf)))
        out.append("| **%s** | %s |" % (f, " | ".join(cells)))
        depth = max(len(p[f]) for p in picks)
        for i in range(depth):
            cells = []
            for p in picks:
                if i < len(p[f]):
                    kn, (ms, c) = p[f][i]
                    cells.append("`%s` | %.3f | %.1f" % (short(kn), ms, c))
                else:
                    cells.append(" | | ")
            out.append("| | %s |" % " | ".join(cells))
    cells = ["%s | **%.3f** | %.0f" % (kernels(len(k)), sum(v[0] for v in k.values()),
                                               sum(v[1] for v in k.values()))
             for _, k, _ in sides]
    out.append("| **total** | %s |" % " | ".join(cells))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", nargs="+", action="append", required=True,
                    metavar="NAME LONG.csv STEPS [SHORT.csv STEPS]")
    ap.add_argument("--top", type=int, default=20, help="kernels listed a side (default 20)")
    ap.add_argument("--title", default="GPU kernels of one training step")
    a = ap.parse_args()
    for s in a.side:
        if len(s) not in (3, 5):
            ap.error("--side takes NAME LONG.csv STEPS [SHORT.csv STEPS], got %s" % s)
    sides = [per_step(s) for s in a.side]
    print("### %s" % a.title)
    print()
    print("Kernel time per step, summed by name over each run's kernel summary; "
          "each side's top %d kernels under their family, the family's total over all its "
          "kernels in bold: %s." % (a.top, "; ".join("%s %s" % (n, h) for n, _, h in sides)))
    print()
    print("\n".join(table(sides, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
