"""A library folder's sources, for tests/base:test_no_stderr (library code
prints only through the log sink, base/errf.h)."""

def library_sources(extra = []):
    """The filegroup `sources`: the folder's C, header and CUDA files.

    Args:
      extra: more glob patterns (a subfolder's files).
    """
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*.c", "*.h", "*.cu"] + extra),
        visibility = ["//tests/base:__pkg__"],
    )
