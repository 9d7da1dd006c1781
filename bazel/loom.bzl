"""One call per library or program named for its file: loom_library("x")
builds x.c with header x.h, loom_binary("x") builds x.c. A target with other
files, or none, stays a plain cc_library or cc_binary."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library")

def loom_library(name, **kwargs):
    """A cc_library of name.c with the header name.h.

    Args:
      name: the target, and its files' stem.
      **kwargs: any other cc_library attribute (deps, copts, visibility, ...).
    """
    cc_library(
        name = name,
        srcs = [name + ".c"],
        hdrs = [name + ".h"],
        **kwargs
    )

def loom_binary(name, **kwargs):
    """A cc_binary of name.c.

    Args:
      name: the target, and its file's stem.
      **kwargs: any other cc_binary attribute (deps, linkopts, ...).
    """
    cc_binary(
        name = name,
        srcs = [name + ".c"],
        **kwargs
    )
