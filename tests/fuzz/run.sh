#!/usr/bin/env bash
# tests/fuzz/run.sh — builds the libFuzzer targets with Debian's clang
# (ASan + UBSan) and runs each for a bounded time on its committed seed
# corpus (tests/fuzz/corpus/<target>, which includes the regression seeds of
# every crash fixed). New inputs go to a working corpus under the output dir,
# never into the repository. Prints one line per target and ends with
# "N passed, N failed"; exits non-zero if any target failed to build,
# crashed, leaked or timed out.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]   (default 60, all)
#   LOOM_FUZZ_OUT=dir   where binaries, working corpora and crashes go
#                       (default ${TMPDIR:-/tmp}/loom-fuzz)
#   LOOM_FUZZ_JOBS=n    targets run at once (default: the cores)
#   LOOM_FUZZ_FLAGS=... more libFuzzer flags (e.g. -runs=10000000 for the
#                       long runs recorded in README.md)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
secs=${1:-60}
shift || true
out=${LOOM_FUZZ_OUT:-${TMPDIR:-/tmp}/loom-fuzz}
CC=${CC_FUZZ:-clang}
FLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
	-fno-omit-frame-pointer -I. -Iinclude)

# target -> its sources besides tests/fuzz/<target>.c, and libraries
declare -A SRCS=(
	[fuzz_idx]="datasets/idx.c datasets/errors.c base/errf.c"
	[fuzz_ckpt]="io/ckpt_file.c io/ckpt_meta.c base/errf.c"
	[fuzz_args]="examples/train_args.c examples/flags.c"
	[fuzz_cifar]="datasets/cifar.c datasets/mnist.c datasets/idx.c datasets/errors.c base/errf.c"
	[fuzz_rendezvous]="comm/wire.c comm/env.c comm/rendezvous.c comm/progress.c comm/rank_note.c comm/store.c base/errf.c base/options.c"
	[fuzz_fingerprint]="comm/wire.c comm/env.c base/errf.c base/options.c"
	[fuzz_safetensors]="io/safetensors.c base/errf.c"
	[fuzz_gpt_tokens]="examples/gpt_data.c"
	[fuzz_gpt_hf]="examples/gpt_hf.c"
	[fuzz_options]="base/options.c base/errf.c"
)
declare -A LIBS=([fuzz_idx]="-lz" [fuzz_ckpt]="-lz -lm" [fuzz_args]="" [fuzz_cifar]="-lz"
	[fuzz_rendezvous]="" [fuzz_fingerprint]="" [fuzz_safetensors]="-ljansson" [fuzz_gpt_tokens]=""
	[fuzz_gpt_hf]="-ljansson" [fuzz_options]="")
targets=("$@")
[ "${#targets[@]}" -eq 0 ] && targets=(fuzz_idx fuzz_ckpt fuzz_args fuzz_cifar fuzz_rendezvous fuzz_fingerprint fuzz_safetensors fuzz_gpt_tokens fuzz_gpt_hf fuzz_options)

if ! command -v "$CC" >/dev/null 2>&1; then
	echo "fuzz: $CC not found (bazel/install_deps.sh installs clang)"
	echo "0 passed, ${#targets[@]} failed"
	exit 1
fi
mkdir -p "$out/bin" "$out/crashes"
pass=0 fail=0
# Every target is built first; then they run LOOM_FUZZ_JOBS at a time
# (default: the cores), each on a core of its own: on CI's 2 cores the
# stage takes half the time for the same executions per target.
jobs=${LOOM_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
built=()
for t in "${targets[@]}"; do
	if [ -z "${SRCS[$t]+x}" ]; then
		echo "fuzz $t: unknown target"
		fail=$((fail + 1))
		continue
	fi
	# shellcheck disable=SC2086 # the source and library lists split on purpose
	if ! "$CC" "${FLAGS[@]}" "tests/fuzz/$t.c" ${SRCS[$t]} ${LIBS[$t]} -o "$out/bin/$t" \
		>"$out/$t.build.log" 2>&1; then
		echo "fuzz $t: FAILED TO BUILD"
		tail -20 "$out/$t.build.log"
		fail=$((fail + 1))
		continue
	fi
	built+=("$t")
done

run_one() { # target: its exit status in $out/$t.rc
	local t=$1
	mkdir -p "$out/corpus/$t"
	# -timeout: one input running 10 s is a hang; -rss_limit_mb: a reader
	# that allocates what a header claims is a failure too.
	"$out/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-max_len=65536 -print_final_stats=1 ${LOOM_FUZZ_FLAGS:-} \
		-artifact_prefix="$out/crashes/$t-" \
		"$out/corpus/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1 </dev/null
	echo $? >"$out/$t.rc"
}

report() { # target
	local t=$1 log="$out/$1.log" rc elapsed execs
	rc=$(cat "$out/$t.rc" 2>/dev/null || echo 1)
	elapsed=$(sed -n 's/^stat::.*//; s/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -n 1)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	if [ "$rc" -eq 0 ]; then
		echo "fuzz $t: ${execs:-?} executions in ${elapsed:-$secs} s, no crash"
		pass=$((pass + 1))
	else
		echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions; input kept in $out/crashes/"
		grep -E 'ERROR:|SUMMARY:|runtime error|does not hold|Test unit written' "$log" | head -n 8
		fail=$((fail + 1))
	fi
}

for ((i = 0; i < ${#built[@]}; i += jobs)); do
	batch=("${built[@]:i:jobs}")
	for t in "${batch[@]}"; do
		rm -f "$out/$t.rc"
		run_one "$t" &
	done
	wait
	for t in "${batch[@]}"; do
		report "$t"
	done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
