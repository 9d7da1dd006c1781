#!/usr/bin/env bash
# tests/engine/cuda/gpu_kprof.sh — one program's GPU kernels, for the GPU
# suite's profile rows, into OUT.csv in the columns of Nsight Systems'
# cuda_gpu_kern_sum (gpu_kernels.py reads them); the program's output
# passes through (the row's verdict reads it). Two ways, the first found:
#   nsys: `nsys profile` (CUDA only, graphs traced node by node, no CPU
#     sampling), then `nsys stats --report cuda_gpu_kern_sum --format csv`
#     (gpukernsum, the report's older name, next); nsys is looked for in
#     $NSYS, on PATH, under $CUDA_HOME, /usr/local/cuda* and
#     /opt/nvidia/nsight-systems*;
#   CUPTI: bin/libloom_kprof.so (kprof_cupti.c; or $LOOM_KPROF_LIB) as the
#     driver's injection library (CUDA_INJECTION64_PATH), which writes the
#     CSV at the program's exit; it opens the host's libcupti
#     (LOOM_KPROF_TOOL=cupti: this way even where there is an nsys).
# usage: gpu_kprof.sh --which        the tool it would use (exit 1: none)
#        gpu_kprof.sh OUT -- command...
# Exits with the program's status, or 3 when no kernel summary came out.
set -u

find_nsys() {
	local c
	for c in "${NSYS:-}" "$(command -v nsys 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/nsys" \
		/usr/local/cuda/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys \
		/usr/local/cuda*/nsight-systems*/target-linux-x64/nsys \
		/opt/nvidia/nsight-systems/*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys; do
		if [ -n "$c" ] && [ -x "$c" ]; then
			echo "$c"
			return 0
		fi
	done
	return 1
}

find_cupti_lib() {
	local c
	for c in "${LOOM_KPROF_LIB:-}" "$(dirname "$0")/bin/libloom_kprof.so"; do
		if [ -n "$c" ] && [ -f "$c" ]; then
			echo "$c"
			return 0
		fi
	done
	return 1
}

if [ "${1:-}" = --which ]; then
	find_nsys || find_cupti_lib
	exit
fi
out=${1:?usage: gpu_kprof.sh OUT -- command...}
[ "${2:-}" = -- ] || { echo "usage: gpu_kprof.sh OUT -- command..." >&2; exit 2; }
shift 2
mkdir -p "$(dirname "$out")"
# LOOM_KPROF_TOOL=cupti takes the second way even where nsys is there.
if [ "${LOOM_KPROF_TOOL:-}" = cupti ] || ! nsys=$(find_nsys); then
	lib=$(find_cupti_lib) || { echo "gpu_kprof: no nsys and no libloom_kprof.so" >&2; exit 127; }
	echo "gpu_kprof: CUPTI through $lib"
	rm -f "$out.csv"
	CUDA_INJECTION64_PATH=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib") \
		LOOM_KPROF_CSV=$out.csv "$@"
	rc=$?
	if ! grep -q 'Total Time' "$out.csv" 2>/dev/null; then
		echo "gpu_kprof: no kernel summary in $out.csv (did the driver load $lib?)"
		[ $rc -eq 0 ] && rc=3
	fi
	exit $rc
fi
echo "gpu_kprof: $nsys ($("$nsys" --version 2>/dev/null | head -n 1))"
"$nsys" profile --trace=cuda --cuda-graph-trace=node --sample=none --cpuctxsw=none \
	--force-overwrite=true --stats=false -o "$out" "$@"
rc=$?
for report in cuda_gpu_kern_sum gpukernsum; do
	"$nsys" stats --report "$report" --format csv --force-export=true "$out.nsys-rep" \
		>"$out.csv" 2>"$out.stats.log" && grep -q 'Total Time' "$out.csv" && break
done
if ! grep -q 'Total Time' "$out.csv" 2>/dev/null; then
	echo "gpu_kprof: no kernel summary in $out.csv:"
	tail -n 5 "$out.stats.log" "$out.csv" 2>/dev/null
	[ $rc -eq 0 ] && rc=3
fi
# The report is big; the CSV is what the table needs.
rm -f "$out.sqlite"
exit $rc
