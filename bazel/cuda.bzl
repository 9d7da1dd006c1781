"""cuda_library: compiles .cu files with nvcc into a cc_library.

SASS for sm_80 (A100) and sm_90 (H100, H200), plus PTX for compute_90, which
the driver compiles at load time on a newer GPU (Blackwell and later) that
has no SASS here.

nvcc runs from a genrule, called by its absolute path because the sandbox has
no PATH to it. Without a toolkit the macro yields a cc_library built from
`fallback_srcs` alone (plain C that reports "no CUDA"), so dependents link either way.

nvcc sees only the genrule's declared inputs, so the macro hands it:
- the headers of this package (a glob), less those `hdrs` already names (a
  label listed twice is an error in Bazel);
- every header the cc `deps` carry, transitively (a small rule reads them out
  of CcInfo), so a .cu can include loom.h or engine/program_internal.h as a
  .c file would, without listing them again.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

def _cc_headers_impl(ctx):
    hdrs = [d[CcInfo].compilation_context.headers for d in ctx.attr.deps if CcInfo in d]
    return [DefaultInfo(files = depset(transitive = hdrs))]

# The transitive headers of cc targets, as plain files for a genrule.
_cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list()},
)

_ARCH_FLAGS = ("-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
               "-gencode arch=compute_90,code=compute_90")

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
    local_hdrs = [h for h in native.glob(["**/*.h", "**/*.cuh"]) if h not in hdrs]
    _cc_headers(
        name = "_%s_dep_hdrs" % name,
        deps = deps,
    )
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0].replace("/", "_")
        obj = "_%s_%s.pic.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + local_hdrs + [":_%s_dep_hdrs" % name, "@local_cuda//:cuda_headers"],
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
