#!/usr/bin/env bash
# Compares the CPU matrix-product candidates on the ConvNet (batch 100, O0)
# in one run, in interleaved rounds so that all see the same state of a
# shared machine, and prints markdown for bench/RESULTS.md. Every candidate
# is the same binary; only the path differs:
#   OpenBLAS as-is        LOOM_CPU_ISA=portable (OpenBLAS picks by CPU model)
#   OpenBLAS SkylakeX     the same with OPENBLAS_CORETYPE=SkylakeX (ceiling
#                         of OpenBLAS when it knows the CPU; not a solution)
#   BLIS                  portable path with libblis preloaded for cblas_sgemm
#   oneDNN avx2 / avx512  LOOM_CPU_ISA=avx2, and no variable (the default:
#                         conv nodes on oneDNN's convolution primitives)
#   im2col conv           the default path with LOOM_CPU_CONV=im2col (conv
#                         nodes on im2col + oneDNN's GEMM, as before them)
#   PyTorch 1.13          bench/torch_convnet.py, 2 threads
#   bench/compare_cpu.sh [rounds] [steps] [quick]     (defaults 3, 150)
# quick leaves out the OpenBLAS and BLIS columns.
# LOOM_BIN overrides the folder with the built binaries (bazel-bin).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-150}
quick=${3:-}
bin=${LOOM_BIN:-}
if [ -z "$bin" ]; then
	bazel build -c opt //bench:bench_convnet >/dev/null 2>&1
	bin=$(bazel info -c opt bazel-bin 2>/dev/null)
fi
blis=/usr/lib/x86_64-linux-gnu/libblis.so.4

run() { # threads env... -> "median / mean / per CPU-second" img/s of the O0 step
	local t=$1
	shift
	env "$@" "$bin/bench/bench_convnet" --steps "$steps" --warmup 15 --levels 0 --threads "$t" \
		2>/dev/null | grep '^| O0' |
		awk -F'|' '{ gsub(/ /, "", $4); gsub(/ /, "", $5); gsub(/ /, "", $12); print $4 " / " $5 " / " $12 }'
}

torch() { # threads -> the same for PyTorch
	/usr/bin/python3 bench/torch_convnet.py speed --steps "$steps" --warmup 15 --threads "$1" 2>/dev/null |
		sed -n 's/torch speed: \([0-9]*\) img\/s median step, \([0-9]*\) img\/s mean, \([0-9]*\) img\/s per CPU-second.*/\1 \/ \2 \/ \3/p'
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(sed -n 's/^cpu family\t*: //p' /proc/cpuinfo | head -1), model $(sed -n 's/^model\t*: //p' /proc/cpuinfo | head -1)), $(nproc) cores; $(date -u +%Y-%m-%d)"
echo "default path: $("$bin/bench/bench_convnet" --steps 1 --warmup 0 --levels 0 2>/dev/null | sed -n 's/.*; \(cpu: .*\)/\1/p')"
echo "OpenBLAS core: $(OPENBLAS_VERBOSE=2 LOOM_CPU_ISA=portable "$bin/bench/bench_convnet" --steps 1 --warmup 0 --levels 0 2>&1 | sed -n 's/^Core: //p')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "ConvNet batch 100, O0, $steps steps; each cell: img/s of the median step / mean / per CPU-second"
echo
echo "| round | threads | OpenBLAS as-is | OpenBLAS SkylakeX | BLIS | oneDNN avx2 | oneDNN avx512, im2col conv | oneDNN avx512 (default) | PyTorch 1.13 | load avg |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for r in $(seq "$rounds"); do
	for t in 2 1; do
		a=- s=- b=-
		if [ -z "$quick" ]; then
			a=$(run $t LOOM_CPU_ISA=portable)
			s=$(run $t LOOM_CPU_ISA=portable OPENBLAS_CORETYPE=SkylakeX)
			b=$([ -e $blis ] && run $t LOOM_CPU_ISA=portable LD_PRELOAD=$blis || echo "-")
		fi
		d2=$(run $t LOOM_CPU_ISA=avx2)
		ic=$(run $t LOOM_CPU_CONV=im2col)
		d5=$(run $t)
		p=$(torch $t)
		echo "| $r | $t | $a | $s | $b | $d2 | $ic | $d5 | ${p:--} | $(cut -d' ' -f1 /proc/loadavg) |"
	done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
