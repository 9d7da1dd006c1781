# bench/common.sh — what the bench scripts share, sourced (bash) after their
# `cd` to the repository root: a build through bazel, a scratch folder that
# goes when the script exits, the fortunes text the GPT runs read, a
# multi-rank run that records each rank's peak memory, and the rounds of a
# side-by-side comparison.

# bazel build "$@" quietly (LOOM_BAZEL_OUTPUT_BASE: bazel's output base);
# bazel_bin: bazel-bin's path under that output base.
bench_build() {
	local ob=()
	[ -n "${LOOM_BAZEL_OUTPUT_BASE:-}" ] && ob=(--output_base="$LOOM_BAZEL_OUTPUT_BASE")
	bazel "${ob[@]}" build "$@" >/dev/null 2>&1
	bazel_bin=$(bazel "${ob[@]}" info bazel-bin 2>/dev/null)
}

# tmp: a fresh folder, removed on exit.
bench_tmp() {
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
}

# The environment of multi-rank CPU runs (mpirun as root, one thread a rank,
# the collectives' timeout TIMEOUT_S seconds), and the scratch folder $tmp.
bench_mpi_env() { # TIMEOUT_S
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
	export LOOM_COMM_TIMEOUT_S=$1
	bench_tmp
}

# text: the file $1, or else the first 2 MB of the fortunes package's text
# in $tmp/text.txt (bench_tmp first); exits when there is none.
bench_text() {
	text=${1:-}
	if [ -z "$text" ]; then
		# cat's SIGPIPE (the text is longer) is no failure under pipefail.
		{ cat /usr/share/games/fortunes/* 2>/dev/null || true; } | head -c 2000000 >"$tmp/text.txt"
		[ -s "$tmp/text.txt" ] || { echo "no text: apt-get install fortunes, or pass a file"; exit 1; }
		text=$tmp/text.txt
	fi
}

# One mpirun of NP ranks of the command CMD... (OMP_NUM_THREADS and
# LOOM_COMM_TIMEOUT_S passed on): every rank's output in $tmp/out, each
# rank's peak RSS in KiB (GNU time) in $tmp/rss.RANK.
bench_mpirun_rss() { # NP CMD...
	local np=$1
	shift
	rm -f "$tmp"/rss.*
	mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x LOOM_COMM_TIMEOUT_S -np "$np" \
		sh -c '/usr/bin/time -f "%M" -o '"$tmp"'/rss.$OMPI_COMM_WORLD_RANK "$@"' sh \
		"$@" >"$tmp/out" 2>&1
}

# The first line of a comparison: when, on how many CPUs of which model,
# under what load.
bench_machine_line() {
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# $ROUNDS rounds of workload NAME: each round runs CMD... once per word of
# $VARIANTS, under the environment (NAME=VALUE words) that VARIANT_ENV
# prints for the variant, so that a shared machine's load falls on every
# variant alike; the table rows of bench_convnet / bench_resnet come out
# tagged "NAME round R VARIANT".
bench_rounds() { # NAME VARIANT_ENV CMD...
	local name=$1 envfn=$2 r v
	shift 2
	for ((r = 1; r <= ROUNDS; r++)); do
		for v in $VARIANTS; do
			env $("$envfn" "$v") "$@" 2>/dev/null | grep -E '^\| (O[0-3]|ResNet)' |
				sed "s/^/$name round $r $v /" || true
		done
	done
}

# The CPU training workloads of the side-by-side comparisons, each word of
# $WORKLOADS (default all three) in bench_rounds with VARIANT_ENV: the
# ConvNet, ResNet-18 at 32 px and ResNet-50 at 96 px, f32 (O0) and O1 bf16,
# from $BIN (bench_convnet, bench_resnet).
bench_cpu_workloads() { # VARIANT_ENV
	local w
	for w in ${WORKLOADS:-convnet resnet18 resnet50}; do
		case $w in
		convnet) bench_rounds convnet "$1" "$BIN/bench_convnet" --steps 20 --warmup 3 --levels 01 --bf16 ;;
		resnet18) bench_rounds resnet18 "$1" "$BIN/bench_resnet" --depth 18 --size 32 --batch-size 16 --steps 3 --warmup 1 --levels 01 --bf16 ;;
		resnet50) bench_rounds resnet50 "$1" "$BIN/bench_resnet" --depth 50 --size 96 --batch-size 4 --steps 2 --warmup 1 --levels 01 --bf16 ;;
		esac
	done
}
