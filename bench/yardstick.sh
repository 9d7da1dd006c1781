#!/usr/bin/env bash
# loom against current PyTorch (eager, bf16 autocast, torch.compile,
# channels-last) and against the machine's own peak, in one alternating run
# (loom, torch, loom, torch, ...: every round sees the same state of a shared
# machine), printed as markdown for bench/RESULTS.md.
#   bench/setup_torch.sh               once: the reference venv, outside the repo
#   bench/yardstick.sh [--quick] [rounds]       (default 2 rounds; --quick: 1
#                                       round of a few steps each, a smoke run)
# Workloads (WORKLOADS, default all four):
#   convnet     one epoch of the ConvNet on Fashion-MNIST (batch 100, SGD lr
#               0.01 momentum 0.9): loom's examples/mnist_ddp and
#               bench/torch_convnet.py train; cell: epoch img/s / test
#               accuracy / img/s per CPU-second / peak RSS MiB
#   resnet18    ResNet-18 on CIFAR-shaped synthetic data (32x32, 10 classes,
#               batch 32): bench_resnet and bench/torch_resnet.py
#   resnet50-16, resnet50-32   ResNet-50 at 224, batch 16 and 32
#               resnet cells: img/s / img/s per CPU-second / peak RSS MiB
#   gpt         the GPT of examples/gpt_ddp at its defaults (4 layers, 4
#               heads, 128 wide, context 128, bytes of the Debian fortunes,
#               batch 8, AdamW) against bench/torch_gpt.py --sdpa (causal
#               scaled_dot_product_attention, as users write it), the same model
#               and settings; GPT_STEPS (30) steps, tok/s over steps 2-N
#               (PyTorch's bf16 autocast GPT_CAP (10): 0.1x fp32's speed on
#               a CPU without avx512_bf16);
#               cell: tok/s / tok/s per CPU-second / peak RSS MiB (loom's
#               CPU-seconds: the whole process, start-up and one validation
#               included; torch's: its steps 2-N)
# Variants: loom O0 (fp32), loom O1 bf16, loom O2 bf16 (native bf16 products
# only where loom chose them at start-up; else loom's exact emulation),
# PyTorch eager fp32, eager bf16 autocast, torch.compile fp32, and for the
# ResNets channels-last (bench/torch_modes.py; compile-cl, torch.compile in
# channels-last, on request). Compiled modes compile in their warm-up,
# outside the timed steps (a second run finds inductor's cache).
# Defaults sized for a shared 2-core machine: the ConvNet's bf16 variants
# (loom O1/O2, PyTorch autocast: 9x slower than fp32 on a CPU without
# avx512_bf16) run CONV_CAP (50) steps of the epoch, not all 600; the
# ResNet tables leave bf16 autocast out (TORCH_MODES_RESNET adds it) and
# ResNet-50 at batch 32 runs loom O0 against PyTorch eager and channels-last.
# After the rounds: per variant the median img/s, its FLOP/s (the model's
# FLOPs per image, forward + backward, counted by loom from its plan) and
# that as a fraction of the fp32 peak bench/bf16_peak measures on the same
# threads, and the ratio to PyTorch eager fp32.
# CPU-seconds: loom's ConvNet cell counts the whole process (/usr/bin/time:
# data loading and the test pass included), torch's its training loop only;
# both ResNet scripts count their timed steps only.
# Variables: TORCH_VENV (default /work/venv-torch), THREADS (2), LOOM_BIN (a
# bazel-bin holding the binaries; default: build them with $BAZEL, default
# `bazel`), LOOM_BIN_B (a second such folder, the "before" build of a
# change: adds a "loom O0 (B)" column after loom O0; LOOM_VARIANTS_B, e.g.
# "O0 O1", names the variants that get one), LOOM_ENV_B (environment settings
# for the B runs only, e.g. "LOOM_FORMATS=nchw"; alone, without LOOM_BIN_B,
# it makes B the same build run with them), LOOM_B_NAME (the B columns' label,
# default "before"), WORKLOADS, LOOM_VARIANTS
# ("O0 O1 O2"), TORCH_MODES_CONVNET ("eager compile bf16"), TORCH_MODES_RESNET
# ("eager cl compile"; "none": no PyTorch column), TORCH_MODES_RESNET_BIG and LOOM_VARIANTS_BIG (ResNet-50
# at batch 32: "eager cl", "O0"), CONV_CAP (50), CONV_STEPS (the ConvNet's
# O0 steps, 600: the whole epoch), PEAK_FP32 and PEAK_FP32_1
# (GFLOP/s on all threads and on one core, in place of what bf16_peak measures
# at the start: on a busy machine the loop gets a fraction of a core).
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
	quick=1
	shift
fi
rounds=${1:-2}
[ $quick = 1 ] && rounds=1
venv=${TORCH_VENV:-/work/venv-torch}
py=$venv/bin/python
threads=${THREADS:-2}
workloads=${WORKLOADS:-convnet resnet18 resnet50-16 resnet50-32 gpt}
loom_variants=${LOOM_VARIANTS:-O0 O1 O2}
tm_convnet=${TORCH_MODES_CONVNET:-eager compile bf16}
tm_resnet=${TORCH_MODES_RESNET:-eager cl compile}
tm_resnet_big=${TORCH_MODES_RESNET_BIG:-eager cl}
tm_gpt=${TORCH_MODES_GPT:-eager bf16 compile}
gpt_steps=${GPT_STEPS:-30}
gpt_cap=${GPT_CAP:-10}
lv_big=${LOOM_VARIANTS_BIG:-O0}
conv_cap=${CONV_CAP:-50}
conv_steps=${CONV_STEPS:-600}
if [ $quick = 1 ]; then
	tm_resnet=${TORCH_MODES_RESNET:-eager cl}
	conv_cap=30
	gpt_steps=${GPT_STEPS:-5}
fi
if ! [ -x "$py" ] || ! "$py" -c 'import torch' 2>/dev/null; then
	echo "yardstick: no torch in $venv: run bench/setup_torch.sh first" >&2
	exit 2
fi
bin=${LOOM_BIN:-}
bin_b=${LOOM_BIN_B:-}
lv_b=${LOOM_VARIANTS_B:-}
env_b=${LOOM_ENV_B:-}
b_name=${LOOM_B_NAME:-before}
if [ -z "$bin" ]; then
	${BAZEL:-bazel} build //bench:bench_resnet //bench:bench_convnet //bench:bf16_peak \
		//examples:mnist_ddp //examples:gpt_ddp >/dev/null 2>&1 || {
		echo "yardstick: build failed" >&2
		exit 1
	}
	bin=$(${BAZEL:-bazel} info bazel-bin 2>/dev/null)
fi
[ -n "$env_b" ] && [ -z "$bin_b" ] && bin_b=$bin
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
# The GPT's text: one file both engines read (the last tenth held out).
text=${GPT_TEXT:-$data/text.txt}
[ -f "$text" ] || cat /usr/share/games/fortunes/* 2>/dev/null | head -c 3000000 >"$text"

# Step counts: (warm-up, timed) per workload.
if [ $quick = 1 ]; then
	conv_max="--max-steps 30" torch_max="--max-steps 30"
	r18="--batch-size 8 --warmup 1 --steps 1" r50_16="--batch-size 2 --warmup 1 --steps 1"
	r50_32="--batch-size 4 --warmup 1 --steps 1"
else
	conv_max="" torch_max=""
	r18="--batch-size 32 --warmup 1 --steps 3" r50_16="--batch-size 16 --warmup 1 --steps 2"
	r50_32="--batch-size 32 --warmup 1 --steps 1"
fi

resnet_args() { # workload -> depth, size, steps args
	case $1 in
	resnet18) echo "--depth 18 --size 32 $r18" ;;
	resnet50-16) echo "--depth 50 --size 224 $r50_16" ;;
	resnet50-32) echo "--depth 50 --size 224 $r50_32" ;;
	esac
}

level_args() { # O0|O1|O2 -> loom flags (mnist_ddp and bench_resnet spell them apart)
	case $1 in
	O0) echo "" ;;
	*) echo "--opt-level $1 --precision bf16" ;;
	esac
}

tf=$data/time

median() { # file of numbers -> their median, or nothing
	sort -n "$1" 2>/dev/null | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'
}
# Each cell also goes to $data/<workload>.<variant> (one img/s per line) and
# .cpu (img/s per CPU-second) for the summary.
keep() { # workload variant img/s per-CPU-s
	[ -n "$3" ] && echo "$3" >>"$data/$1.$2"
	[ -n "$4" ] && echo "$4" >>"$data/$1.$2.cpu"
}

loom_convnet() { # level -> cell
	local out r n=$conv_steps
	[ -n "$conv_max" ] && n=30
	[ "$1" != O0 ] && n=$conv_cap
	out=$(/usr/bin/time -f "%U %S %M" -o "$tf" "$bin/examples/mnist_ddp" --epochs 1 --device cpu \
		--threads "$threads" $(level_args "$1") $([ $n != 600 ] && echo --max-steps $n) 2>/dev/null |
		grep '^epoch 1 done')
	r=$(sed -n 's/.*(\([0-9.]*\) img\/s).*/\1/p' <<<"$out")
	pc=$(awk -v n="$n" '{ c = $1 + $2; printf "%.0f", n * 100 / (c > 0 ? c : 1) }' "$tf")
	keep convnet "${tag:-loom} $1" "$r" "$pc"
	echo "$r / $(sed -n 's/.*test accuracy \([0-9.]*%\).*/\1/p' <<<"$out") / $pc / $(awk '{ printf "%.0f", $3 / 1024 }' "$tf")"
}

torch_convnet() { # mode -> cell
	local out r
	local cap=$torch_max
	[ "$1" = bf16 ] && cap="--max-steps $conv_cap"
	out=$("$py" bench/torch_convnet.py train --epochs 1 --threads "$threads" --mode "$1" \
		$cap 2>/dev/null | grep '^torch epoch 1')
	r=$(sed -n 's/.*%, \([0-9]*\) img\/s,.*/\1/p' <<<"$out")
	pc=$(sed -n 's/.* \([0-9]*\) img\/s per CPU-second.*/\1/p' <<<"$out")
	keep convnet "torch $1" "$r" "$pc"
	echo "$r / $(sed -n 's/.*test accuracy \([0-9.]*%\).*/\1/p' <<<"$out") / $pc /" \
		"$(sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' <<<"$out")"
}

loom_resnet() { # workload level -> cell
	local out r lv=${2#O}
	out=$("$bin/bench/bench_resnet" $(resnet_args "$1") --levels "$lv" $([ "$2" != O0 ] && echo --bf16) \
		--device cpu --threads "$threads" 2>/dev/null | grep '^| ResNet')
	r=$(awk -F'|' '{ gsub(/ /, "", $7); print $7 }' <<<"$out")
	keep "$1" "${tag:-loom} $2" "$r" "$(awk -F'|' '{ gsub(/ /, "", $8); print $8 }' <<<"$out")"
	awk -F'|' '{ for (i = 7; i <= 9; i++) gsub(/ /, "", $i); if ($7 != "") printf "%s / %s / %s", $7, $8, $9 }' <<<"$out"
}

torch_resnet() { # workload mode -> cell
	local out r
	out=$("$py" bench/torch_resnet.py $(resnet_args "$1") --threads "$threads" --mode "$2" 2>/dev/null |
		grep '^torch resnet')
	r=$(sed -n 's/.*: \([0-9.]*\) img\/s,.*/\1/p' <<<"$out")
	pc=$(sed -n 's/.* \([0-9.]*\) img\/s per CPU-second.*/\1/p' <<<"$out")
	keep "$1" "torch $2" "$r" "$pc"
	[ -n "$r" ] && echo "$r / $pc / $(sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' <<<"$out")"
}

gpt_args=(--data "$text" --batch-size 8 --threads "$threads")

loom_gpt() { # level -> cell
	local out r
	out=$(/usr/bin/time -f "%U %S %M" -o "$tf" "$bin/examples/gpt_ddp" "${gpt_args[@]}" --device cpu \
		$(level_args "$1") --max-steps "$gpt_steps" --log-interval 1 --sample 0 --val-interval 0 \
		--val-batches 1 2>/dev/null)
	# Steps 2-N from their own ms/step (the first pays for start-up).
	r=$(grep '^step .*ms/step' <<<"$out" | awk 'NR > 1 { for (i = 1; i < NF; i++) if ($(i + 1) == "ms/step") s += $i; n++ }
		END { if (n && s > 0) printf "%.0f", n * 8 * 128 * 1000 / s }')
	pc=$(awk -v n="$gpt_steps" '{ c = $1 + $2; printf "%.0f", n * 8 * 128 / (c > 0 ? c : 1) }' "$tf")
	keep gpt "${tag:-loom} $1" "$r" "$pc"
	[ -n "$r" ] && echo "$r / $pc / $(awk '{ printf "%.0f", $3 / 1024 }' "$tf")"
}

torch_gpt() { # mode -> cell
	local out r pc flags=()
	local n=$gpt_steps
	case $1 in
	bf16) flags=(--autocast bf16) n=$((gpt_cap < n ? gpt_cap : n)) ;;
	compile) flags=(--compile) ;;
	esac
	# SDPA: the attention PyTorch users run (issue 41), not the written-out one.
	out=$("$py" bench/torch_gpt.py "${gpt_args[@]}" --sdpa --steps "$n" "${flags[@]}" 2>/dev/null)
	r=$(sed -n 's/.* \([0-9]*\) tok\/s$/\1/p' <<<"$out")
	pc=$(sed -n 's/^torch cpu: \([0-9]*\) tok\/s per CPU-second.*/\1/p' <<<"$out")
	keep gpt "torch $1" "$r" "$pc"
	[ -n "$r" ] && echo "$r / $pc / $(sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' <<<"$out")"
}

variants() { # workload -> the column names, in running order (loom, torch alternating)
	local tm lv i=0 n
	lv=($loom_variants)
	case $1 in
	convnet) tm=($tm_convnet) ;;
	gpt) tm=($tm_gpt) ;;
	resnet50-32) tm=($tm_resnet_big) lv=($lv_big) ;;
	*) tm=($tm_resnet) ;;
	esac
	n=$((${#lv[@]} > ${#tm[@]} ? ${#lv[@]} : ${#tm[@]}))
	for ((i = 0; i < n; i++)); do
		[ $i -lt ${#lv[@]} ] && echo "loom ${lv[$i]}"
		[ -n "$bin_b" ] && [ $i -lt ${#lv[@]} ] && [[ " ${lv_b:-${lv[0]}} " == *" ${lv[$i]} "* ]] &&
			echo "loomB ${lv[$i]}"
		[ $i -lt ${#tm[@]} ] && [ "${tm[$i]}" != none ] && echo "torch ${tm[$i]}"
	done
}

cell() { # workload variant -> cell
	local w=$1 kind=${2%% *} v=${2#* }
	case $w.$kind in
	convnet.loom) loom_convnet "$v" ;;
	convnet.loomB) (
		[ -n "$env_b" ] && export $env_b
		bin=$bin_b tag=loomB loom_convnet "$v"
	) ;;
	convnet.torch) torch_convnet "$v" ;;
	gpt.loom) loom_gpt "$v" ;;
	gpt.loomB) (
		[ -n "$env_b" ] && export $env_b
		bin=$bin_b tag=loomB loom_gpt "$v"
	) ;;
	gpt.torch) torch_gpt "$v" ;;
	*.loom) loom_resnet "$w" "$v" ;;
	*.loomB) (
		[ -n "$env_b" ] && export $env_b
		bin=$bin_b tag=loomB loom_resnet "$w" "$v"
	) ;;
	*) torch_resnet "$w" "$v" ;;
	esac
}

label() { # variant -> column title
	case $1 in
	"loom O0") echo "loom O0 fp32" ;;
	"loomB O0") echo "loom O0 fp32 (B: $b_name)" ;;
	"loomB O1" | "loomB O2") echo "loom ${1#loomB } bf16 (B: $b_name)" ;;
	"loom O1" | "loom O2") echo "$1 bf16" ;;
	"torch eager") echo "PyTorch eager fp32" ;;
	"torch bf16") echo "PyTorch eager bf16 autocast" ;;
	"torch compile") echo "torch.compile fp32" ;;
	"torch cl") echo "PyTorch eager fp32 channels-last" ;;
	"torch compile-cl") echo "torch.compile fp32 channels-last" ;;
	*) echo "$1" ;;
	esac
}

gflop_per_img() { # workload -> the model's GFLOP per image (per token for the GPT: nanoGPT's
	# 6N + 12LCT, which gpt_ddp prints), forward + backward, from loom's plan
	if [ "$1" = gpt ]; then
		"$bin/examples/gpt_ddp" "${gpt_args[@]}" --device cpu --max-steps 1 --sample 0 --val-interval 0 \
			--val-batches 1 --peak-flops 1 2>/dev/null | sed -n 's/.*, \([0-9.]*\) MFLOP per token.*/\1/p' |
			awk 'NR == 1 { print $1 / 1000 }'
	elif [ "$1" = convnet ]; then
		"$bin/bench/bench_convnet" --steps 1 --warmup 0 --levels 0 --threads 1 2>/dev/null |
			awk -F'|' '/^\| O0/ { gsub(/ /, "", $13); print $13 / 1000 }'
	else
		"$bin/bench/bench_resnet" $(resnet_args "$1" | sed 's/--steps [0-9]*/--steps 1/; s/--warmup [0-9]*/--warmup 0/') \
			--levels 0 --threads 1 2>/dev/null |
			awk -F'|' '/^\| ResNet/ { gsub(/ /, "", $10); print $10 }'
	fi
}

cpu_line() {
	echo "$(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1) (family $(sed -n 's/^cpu family\t*: //p' /proc/cpuinfo | head -1), model $(sed -n 's/^model\t*: //p' /proc/cpuinfo | head -1)), $(nproc) cores, flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512vl|avx512_bf16|amx_bf16)$' | paste -sd' ')"
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: bench/yardstick.sh $([ $quick = 1 ] && echo '--quick ')$rounds (WORKLOADS=\"$workloads\", THREADS=$threads)"
echo "machine: $(cpu_line)"
echo "versions: loom $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes'), $("$py" -c 'import sys, torch; print("PyTorch", torch.__version__, "(Python", sys.version.split()[0] + ")", end="")'), $("$bin/bench/bench_convnet" --steps 1 --warmup 0 --levels 0 --threads "$threads" 2>/dev/null | sed -n 's/.*; \(cpu: .*\)/loom \1/p'), oneDNN $(dpkg-query -W -f '${Version}' libdnnl2 2>/dev/null || echo '?')"
echo "load average before: $(uptime | sed 's/.*load average: //')"
peak_out=$("$bin/bench/bf16_peak" 5 "$threads")
peak=$(sed -n 's/^peak: fp32 \([0-9.]*\) GFLOP\/s.*/\1/p' <<<"$peak_out")
peak1=$(sed -n 's/^peak: fp32 .*(best on 1 thread \([0-9.]*\),.*/\1/p' <<<"$peak_out")
# On a busy machine the loop itself gets a fraction of a core: a peak known
# from a quiet moment can be given instead.
peak=${PEAK_FP32:-$peak}
peak1=${PEAK_FP32_1:-$peak1}
echo
echo '```'
echo "$peak_out"
echo '```'
echo
echo "fp32 peak used below: $peak GFLOP/s on $threads threads, $peak1 on one core (bench/bf16_peak: the best of 5 rounds). Per CPU-second figures divide by one core's peak: on a shared machine they say how well a process uses the core time it gets."

for w in $workloads; do
	gf=$(gflop_per_img "$w")
	mapfile -t vs < <(variants "$w")
	echo
	case $w in
	convnet) echo "### ConvNet, Fashion-MNIST, $([ $quick = 1 ] && echo '30 steps' || echo "1 epoch (600 steps; loom O1/O2 bf16 and PyTorch bf16 autocast: the first $conv_cap)"), batch 100, $threads threads ($gf GFLOP/img); cell: img/s / test accuracy / img/s per CPU-second / peak RSS MiB" ;;
	gpt) echo "### GPT (gpt_ddp's defaults: 4 layers, 4 heads, 128 wide, context 128, vocabulary 256), batch 8, $gpt_steps steps (tok/s over steps 2-$gpt_steps; PyTorch bf16 autocast: $gpt_cap), $threads threads ($gf GFLOP/token, 6N + 12LCT); cell: tok/s / tok/s per CPU-second / peak RSS MiB" ;;
	*) echo "### $w: $(resnet_args "$w"), $threads threads ($gf GFLOP/img); cell: img/s / img/s per CPU-second / peak RSS MiB" ;;
	esac
	unit=img
	[ "$w" = gpt ] && unit=tok
	echo
	head="| round |"
	for v in "${vs[@]}"; do head+=" $(label "$v") |"; done
	echo "$head load avg |"
	echo "$head load avg |" | sed 's/[^|]\+/ --- /g'
	for r in $(seq "$rounds"); do
		row="| $r |"
		for v in "${vs[@]}"; do
			c=$(cell "$w" "$v")
			row+=" ${c:--} |"
		done
		echo "$row $(cut -d' ' -f1 /proc/loadavg) |"
	done
	echo
	echo "| $w | $unit/s | GFLOP/s | % of fp32 peak | / PyTorch eager | $unit/s per CPU-s | GFLOP per CPU-s | % of one core's peak | / PyTorch eager per CPU-s |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
	base=$(median "$data/$w.torch eager") basec=$(median "$data/$w.torch eager.cpu")
	for v in "${vs[@]}"; do
		awk -v name="$(label "$v")" -v gf="$gf" -v pk="$peak" -v pk1="$peak1" -v base="$base" \
			-v basec="$basec" -v m="$(median "$data/$w.$v")" -v c="$(median "$data/$w.$v.cpu")" '
			function ratio(x, y) { return x != "" && y != "" && y > 0 ? sprintf("%.2fx", x / y) : "-" }
			function pct(x, y) { return x != "" && y > 0 ? sprintf("%.1f%%", 100 * x * gf / y) : "-" }
			function f(x, fmt) { return x != "" ? sprintf(fmt, x) : "-" }
			BEGIN {
				printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, f(m, "%.4g"),
					f(m != "" ? m * gf : "", "%.1f"), pct(m, pk), ratio(m, base), f(c, "%.4g"),
					f(c != "" ? c * gf : "", "%.1f"), pct(c, pk1), ratio(c, basec)
			}'
	done
done
echo
echo "load average after: $(uptime | sed 's/.*load average: //')"
