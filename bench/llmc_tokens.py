#!/usr/bin/env python3
"""bench/llmc_tokens.py TEXT OUT_DIR: llm.c's token files from a text's bytes
(each byte an id), OUT_DIR/train.bin (nine tenths) and OUT_DIR/val.bin: a
256-int header (magic 20240520, version 1, the count) and uint16 ids, as
llm.c's data loader reads them. For bench/llmc_compare.sh and the GPU
bundle (bazel/gpu_bundle.sh)."""
import struct
import sys

data = open(sys.argv[1], "rb").read()
cut = len(data) - len(data) // 10
for name, part in (("train", data[:cut]), ("val", data[cut:])):
    with open("%s/%s.bin" % (sys.argv[2], name), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
        f.write(bytes(b for c in part for b in (c, 0)))
