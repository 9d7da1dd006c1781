#!/usr/bin/env bash
# tests/engine/cuda/gpu_kprof.sh — one program's GPU kernels under Nsight
# Systems, for the GPU suite's profile rows: the program runs under
# `nsys profile` (CUDA only, graphs traced node by node, no CPU sampling),
# its output passes through (the row's verdict reads it), then
# `nsys stats --report cuda_gpu_kern_sum --format csv` writes OUT.csv
# (gpu_kernels.py reads it; gpukernsum, the report's older name, tried
# next).
# usage: gpu_kprof.sh --which        the nsys it would use (exit 1: none)
#        gpu_kprof.sh OUT -- command...
# nsys is looked for in $NSYS, on PATH, under $CUDA_HOME and /usr/local/cuda*
# and /opt/nvidia/nsight-systems*. Exits with the program's status, or 3
# when no kernel summary came out.
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

if [ "${1:-}" = --which ]; then
	find_nsys
	exit
fi
out=${1:?usage: gpu_kprof.sh OUT -- command...}
[ "${2:-}" = -- ] || { echo "usage: gpu_kprof.sh OUT -- command..." >&2; exit 2; }
shift 2
nsys=$(find_nsys) || { echo "gpu_kprof: no nsys on this host" >&2; exit 127; }
mkdir -p "$(dirname "$out")"
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
