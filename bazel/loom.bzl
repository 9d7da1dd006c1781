"""What a folder's BUILD file loads, in one load: loom_library("x") builds
x.c with header x.h, loom_binary("x") builds x.c; a target with other files,
or none, stays a plain cc_library or cc_binary, passed on from rules_cc with
cuda_library and CUDA_ENABLED (cuda.bzl) and library_sources (sources.bzl)."""

load("@rules_cc//cc:defs.bzl", _cc_binary = "cc_binary", _cc_library = "cc_library")
load("@local_cuda//:defs.bzl", _CUDA_ENABLED = "CUDA_ENABLED")
load("//bazel:cuda.bzl", _cuda_library = "cuda_library")
load("//bazel:sources.bzl", _library_sources = "library_sources")

cc_binary = _cc_binary
cc_library = _cc_library
cuda_library = _cuda_library
library_sources = _library_sources

# Whether a CUDA toolkit was found (cuda_configure.bzl): without one there is
# no plugin and loom is CPU-only.
CUDA_ENABLED = _CUDA_ENABLED

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
