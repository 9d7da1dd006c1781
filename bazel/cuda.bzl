"""cuda_library: compiles .cu files with nvcc (sm_80 and sm_90) into a cc_library.

nvcc runs from a genrule, called by its absolute path because the sandbox has
no PATH to it. Without a toolkit the macro yields a cc_library built from
`fallback_srcs` alone (plain C that reports "no CUDA"), so dependents link either way.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

_ARCH_FLAGS = "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"

def cuda_library(name, srcs, hdrs = [], deps = [], fallback_srcs = [], copts = [], **kwargs):
    if not CUDA_ENABLED:
        native.cc_library(
            name = name,
            srcs = fallback_srcs,
            hdrs = hdrs,
            deps = deps,
            **kwargs
        )
        return
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0].replace("/", "_")
        obj = "_%s_%s.pic.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + native.glob(["**/*.h", "**/*.cuh"]) + ["@local_cuda//:cuda_headers"],
            outs = [obj],
            cmd = ("%s -std=c++17 -O3 %s -Xcompiler -fPIC -I. -Iinclude " +
                   "-I$(GENDIR) -c $(location %s) -o $@ %s") % (NVCC, _ARCH_FLAGS, src, " ".join(copts)),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        linkstatic = 1,
        defines = ["LOOM_HAVE_CUDA=1"],
        **kwargs
    )
