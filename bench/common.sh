# bench/common.sh — what the bench scripts share, sourced (bash) after their
# `cd` to the repository root: a build through bazel, a scratch folder that
# goes when the script exits, the fortunes text the GPT runs read, and a
# multi-rank run that records each rank's peak memory.

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

# text: the file $1, or else the first 2 MB of the fortunes package's text
# in $tmp/text.txt (bench_tmp first); exits when there is none.
bench_text() {
	text=${1:-}
	if [ -z "$text" ]; then
		cat /usr/share/games/fortunes/* 2>/dev/null | head -c 2000000 >"$tmp/text.txt" ||
			{ echo "no text: apt-get install fortunes, or pass a file"; exit 1; }
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
