#!/usr/bin/env bash
# Runs the ConvNet benchmarks side by side and prints markdown for
# bench/RESULTS.md: loom's training throughput and planned memory per opt
# level, PyTorch's throughput on the same model (if python3-torch is
# installed), and the 2-epoch test accuracy of both.
#   bench/run_convnet.sh [--quick]    (--quick: speed only, no 2-epoch runs)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

bazel build -c opt //bench:bench_convnet //examples:mnist_ddp >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%Y-%m-%d)"
echo
"$bin/bench/bench_convnet" --steps 300 --warmup 30 2>/dev/null
"$bin/bench/bench_convnet" --steps 300 --warmup 30 --levels 123 --bf16 2>/dev/null | tail -n 3
echo
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	# Interleaved rounds, so that both see the same state of this shared
	# machine; each round prints loom O0 and PyTorch (2 threads) in turn.
	echo "| round | loom O0 img/s (median step / mean) | PyTorch 2 threads img/s (median step / mean) |"
	echo "| --- | --- | --- |"
	for r in 1 2 3; do
		l=$("$bin/bench/bench_convnet" --steps 200 --warmup 20 --levels 0 2>/dev/null | grep "^| O0" |
			awk -F'|' '{ gsub(/ /, "", $4); gsub(/ /, "", $5); print $4 " / " $5 }')
		t=$(/usr/bin/python3 bench/torch_convnet.py speed --steps 200 --warmup 20 --threads 2 2>/dev/null |
			sed -n 's/torch speed: \([0-9]*\) img\/s median step, \([0-9]*\) img\/s mean.*/\1 \/ \2/p')
		echo "| $r | $l | $t |"
	done
else
	echo "(python3-torch not installed: no PyTorch comparison)"
fi
[ $quick = 1 ] && exit 0
echo
echo "| run | epoch 1 test acc | epoch 2 test acc | epoch img/s |"
echo "| --- | --- | --- | --- |"
for lvl in O0 O1 O2 O3; do
	out=$("$bin/examples/mnist_ddp" --epochs 2 --opt-level $lvl --log-interval 100000 2>/dev/null)
	acc=$(echo "$out" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | paste -sd'|' | sed 's/|/% | /')
	ips=$(echo "$out" | sed -n 's/.*(\([0-9]*\) img\/s).*/\1/p' | paste -sd'/')
	echo "| loom $lvl fp16 | $acc% | $ips |"
done
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	out=$(/usr/bin/python3 bench/torch_convnet.py train --epochs 2 2>/dev/null)
	acc=$(echo "$out" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | paste -sd'|' | sed 's/|/% | /')
	ips=$(echo "$out" | sed -n 's/.*, \([0-9]*\) img\/s/\1/p' | paste -sd'/')
	echo "| torch 1.13 fp32 | $acc% | $ips |"
fi
