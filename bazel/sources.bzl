"""A library folder's sources, for tests/base's greps over the library:
test_no_stderr (library code prints only through the log sink, base/errf.h),
test_no_getenv (the environment is read in base/options.c alone) and
test_include_arrows (every include points down the folder table)."""

def library_sources(extra = []):
    """The filegroup `sources`: the folder's C, header, CUDA and X-macro files.

    Args:
      extra: more glob patterns (a subfolder's files).
    """
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*.c", "*.h", "*.cu", "*.cuh", "*.def"] + extra),
        visibility = ["//tests/base:__pkg__"],
    )
