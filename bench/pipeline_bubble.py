#!/usr/bin/env python3
"""The pipeline's bubble, measured: reads Chrome traces that loom_trace_stop
writes (`--trace FILE.json` of the examples, run with `--pipeline P
--micro-batches M`) and prints, per rank, the share of each traced train step
that no compute span covers, against the textbook bubble (p-1)/(m+p-1).

A step is a rank's "train step N" span; it is busy where a node, an
accumulation span or the optimizer phase of the same step lies on that
rank's compute track (their union: overlaps count once), and idle elsewhere:
waiting for a receive, for its sends' slots, for the loss's all-reduce. The
run span, the forward and backward phase spans and the receives are not work. Node spans alone are shown
too (the accumulation sums are the pipeline's own extra work), and the share
of the step spent in receives (the rest of the idle time: waits for sends,
the loss's all-reduce, the executor between spans).
Standard library only (no torch).

usage: bench/pipeline_bubble.py [--stages P --micro M] TRACE.json [LABEL=]TRACE.json...
"""
import argparse
import collections
import json

WORK = {"forward", "backward", "node", "accumulate", "optimizer"}


def union_us(spans, lo, hi):
    """Microseconds of [lo, hi) covered by the union of spans."""
    cut = sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi)
    tot, end = 0.0, lo
    for a, b in cut:
        if b <= end:
            continue
        tot += b - max(a, end)
        end = b
    return tot


def per_rank(path):
    """{rank: [(step_us, busy_us, node_us, recv_us), ...]} over the traced train steps."""
    with open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = collections.defaultdict(list)
    work = collections.defaultdict(list)
    recv = collections.defaultdict(list)
    for e in ev:
        if e.get("tid") != 0:
            continue  # the comm track
        key = (e["pid"], e.get("args", {}).get("run"))
        span = (e["ts"], e["ts"] + e["dur"])
        if e.get("cat") == "run" and e["name"].startswith("train step"):
            steps[key].append(span)
        elif e.get("cat") in WORK or (e.get("cat") == "phase" and e["name"] == "optimizer"):
            work[key].append((span, "node" in e.get("args", {})))
        elif e.get("cat") == "comm" and e["name"].startswith("receive "):
            recv[key].append(span)
    out = collections.defaultdict(list)
    for (rank, run), ss in sorted(steps.items()):
        for lo, hi in ss:
            w = work[(rank, run)]
            busy = union_us([s for s, _ in w], lo, hi)
            node = union_us([s for s, is_node in w if is_node], lo, hi)
            out[rank].append((hi - lo, busy, node, union_us(recv[(rank, run)], lo, hi)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("traces", nargs="+", help="[LABEL=]TRACE.json")
    a = ap.parse_args()
    p, m = a.stages, a.micro
    book = (p - 1) / (m + p - 1)
    print(f"textbook bubble (p-1)/(m+p-1) at p = {p}, m = {m}: {book:.3f}")
    print("| trace | rank | steps | ms per step | idle (not node/accum/optim) | "
          "idle (not node) | idle per step (min-max) | of which receiving |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in a.traces:
        label, _, path = t.rpartition("=")
        for rank, rows in sorted(per_rank(path).items()):
            step = sum(r[0] for r in rows)
            idle = 1 - sum(r[1] for r in rows) / step
            idle_node = 1 - sum(r[2] for r in rows) / step
            each = [1 - r[1] / r[0] for r in rows]
            rcv = sum(r[3] for r in rows) / step
            print(f"| {label or path} | {rank} | {len(rows)} | {step / 1e3 / len(rows):.2f} | "
                  f"{idle:.3f} | {idle_node:.3f} | {min(each):.3f}-{max(each):.3f} | {rcv:.3f} |")


if __name__ == "__main__":
    main()
