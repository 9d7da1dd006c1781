#!/usr/bin/env bash
# tests/engine/cuda/test_kprof_cupti.sh — libloom_kprof.so (kprof_cupti.c),
# the GPU suite's CUPTI profile where a host has no Nsight Systems, with a
# stand-in libcupti (fake_cupti.c) that hands it made-up kernel records:
# through gpu_kprof.sh it writes the CSV at the program's exit, names
# demangled and quoted, kernels summed by name, other activity skipped, the
# program's output passed through; gpu_kernels.py reads the CSV by family.
# args: libloom_kprof.so libfake_cupti.so gpu_kprof.sh gpu_kernels.py
set -u
lib=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
fake=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
kprof=$3
kernels=$4
py=$(command -v python3) || { echo "FAIL: no python3"; exit 1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
failed=0
fail() {
	echo "FAIL: $*"
	failed=$((failed + 1))
}

# No driver here: the program loads the library and calls what the driver
# would, then prints a figure as gpt_ddp does.
LOOM_KPROF_TOOL=cupti LOOM_KPROF_LIB=$lib LOOM_KPROF_CUPTI=$fake bash "$kprof" "$d/run" -- \
	"$py" -c 'import ctypes, sys; assert ctypes.CDLL(sys.argv[1]).InitializeInjection() == 1; print("step 10/10  42 tok/s")' \
	"$lib" >"$d/out" 2>&1 || fail "gpu_kprof.sh exited $?: $(tail -n 3 "$d/out")"
cat "$d/out"
grep -q '42 tok/s' "$d/out" || fail "the program's output is not passed through"
grep -q 'gpu_kprof: CUPTI through' "$d/out" || fail "gpu_kprof.sh did not say its way"
grep -q 'loom_kprof: 3 kernels, 45.000 ms' "$d/out" || fail "the library's closing line"
cat "$d/run.csv"
grep -qx 'Time (%),Total Time (ns),Instances,Avg (ns),Name' "$d/run.csv" || fail "the CSV header"
grep -qF '20000000,10,2000000.0,"loom_opt_update_kernel(float*, float const*, int)"' "$d/run.csv" ||
	fail "the update kernel: summed and demangled"
grep -qF '20000000,20,1000000.0,"nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"' "$d/run.csv" ||
	fail "the product kernel: summed"
grep -qF '"odd,""name""_kernel"' "$d/run.csv" || fail "a name with a comma and a quote, quoted"
grep -q memcpy "$d/run.csv" && fail "a memcpy record counted as a kernel"

"$py" "$kernels" --side loom "$d/run.csv" 10 >"$d/k.md" 2>&1 || fail "gpu_kernels.py exited $?"
cat "$d/k.md"
grep -qE '^\| \*\*adamw\*\* \| 1 kernel \| \*\*2\.000\*\* \| 1 \|$' "$d/k.md" || fail "adamw per step"
grep -qE '^\| \*\*matmul\*\* \| 1 kernel \| \*\*2\.000\*\* \| 2 \|$' "$d/k.md" || fail "matmul per step"
grep -qF '`odd,"name"_kernel`' "$d/k.md" || fail "the odd name in the table"

# Without that libcupti (another of the host's may refuse: no driver here)
# the library says so and the run still ends, no CSV.
LOOM_KPROF_TOOL=cupti LOOM_KPROF_LIB=$lib LOOM_KPROF_CUPTI=$d/none.so bash "$kprof" "$d/nolib" -- \
	"$py" -c 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).InitializeInjection())' "$lib" \
	>"$d/nolib.out" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "no libcupti: exit $rc, want 3 (no kernel summary)"
grep -qE 'loom_kprof: (no libcupti|CUPTI refused)' "$d/nolib.out" || fail "no libcupti is not said"

echo "$failed failed"
[ $failed -eq 0 ]
