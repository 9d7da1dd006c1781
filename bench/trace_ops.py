#!/usr/bin/env python3
"""Where a loom step's time goes, by op: reads the Chrome trace that
loom_trace_stop writes (`--trace FILE.json` of the examples) and prints, per
op (fused ops under their fused name) and phase, the summed span time, its
share of the traced node time and the number of spans, largest first.
Standard library only (no torch).

usage: bench/trace_ops.py TRACE.json [--top N]
"""
import argparse
import collections
import json
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    with open(a.trace) as f:
        ev = json.load(f)["traceEvents"]
    tot = collections.defaultdict(float)
    cnt = collections.Counter()
    runs = set()
    for e in ev:
        if e.get("ph") != "X" or "node" not in e.get("args", {}):
            continue
        op = re.sub(r" #\d+$", "", e["name"])
        key = (op, e.get("cat", ""))
        tot[key] += e["dur"]
        cnt[key] += 1
        runs.add(e["args"].get("run"))
    all_us = sum(tot.values())
    n = max(len(runs), 1)
    print(f"{len(runs)} traced step(s), {all_us / 1e3 / n:.1f} ms of node spans per step")
    print("| op | phase | ms per step | share | spans per step |")
    print("| --- | --- | --- | --- | --- |")
    for (op, cat), us in sorted(tot.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"| {op} | {cat} | {us / 1e3 / n:.1f} | {100 * us / all_us:.1f}% | {cnt[(op, cat)] // n} |")


if __name__ == "__main__":
    main()
