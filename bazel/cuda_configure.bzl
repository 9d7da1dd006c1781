"""Finds a local CUDA toolkit and exposes it as the repository @local_cuda.

CUDA_HOME wins, else the toolkit of the `nvcc` on PATH, else /usr/local/cuda;
the choice (or "none") is printed when the repository is made. With no toolkit (no nvcc or no
cuda_runtime.h) the repository still exists, with CUDA_ENABLED = False and
empty libraries, so the whole build succeeds CPU-only.
"""

_LIBS = {
    # target: (header that must exist, shared library name)
    "cublasLt": ("cublasLt.h", "libcublasLt.so"),
    "cudnn": ("cudnn.h", "libcudnn.so"),
    "nccl": ("nccl.h", "libnccl.so"),
}

def _find_lib_dir(rctx, home, so):
    for d in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        if rctx.path(home + "/" + d + "/" + so).exists:
            return d
    return None

# (home, how it was found): CUDA_HOME, then nvcc on PATH, then the default.
def _find_home(rctx):
    if rctx.os.environ.get("CUDA_HOME"):
        return rctx.os.environ["CUDA_HOME"], "CUDA_HOME"
    nvcc = rctx.which("nvcc")
    if nvcc != None:
        # bin/nvcc may be a link (Debian's /usr/bin/nvcc): follow it.
        real = nvcc.realpath
        return str(real.dirname.dirname), "nvcc on PATH (%s)" % nvcc
    return "/usr/local/cuda", "the default location"

def _cuda_configure_impl(rctx):
    home, how = _find_home(rctx)
    nvcc = home + "/bin/nvcc"
    enabled = (rctx.path(nvcc).exists and
               rctx.path(home + "/include/cuda_runtime.h").exists)
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if enabled:
        rctx.symlink(home + "/include", "include")
        libdir = _find_lib_dir(rctx, home, "libcudart_static.a")
        if libdir == None:
            enabled = False
    if enabled:
        rctx.symlink(home + "/" + libdir, "lib")
        rpath = home + "/" + libdir
        build.append("""cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)
""")
        for name, (hdr, so) in _LIBS.items():
            have = (rctx.path(home + "/include/" + hdr).exists and
                    rctx.path(home + "/" + libdir + "/" + so).exists)
            if have:
                # Linked by name, found at run time through the rpath here or
                # LD_LIBRARY_PATH on a GPU host with another layout.
                build.append("""cc_library(
    name = "%s",
    linkopts = ["-L%s", "-Wl,-rpath,%s", "-l%s"],
    deps = [":cuda_headers"],
)
""" % (name, rpath, rpath, so[3:-3]))
            else:
                build.append('cc_library(name = "%s")\n' % name)
    else:
        for name in ["cuda_headers", "cudart"] + list(_LIBS.keys()):
            build.append('cc_library(name = "%s")\n' % name)
    if enabled:
        print("loom: CUDA toolkit at %s, found through %s: the CUDA plugin is built" % (home, how))
    else:
        print("loom: no CUDA toolkit (looked at %s, found through %s): CPU-only build" % (home, how))
    rctx.file("BUILD", "\n".join(build))
    rctx.file("defs.bzl", "CUDA_ENABLED = %s\nNVCC = %r\nCUDA_HOME = %r\n" % (
        enabled,
        nvcc if enabled else "",
        home if enabled else "",
    ))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "PATH"],
    local = True,
)
