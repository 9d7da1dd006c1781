#!/usr/bin/env bash
# tests/engine/cpu/test_spin_same_bits.sh — a small GPT (examples/gpt_ddp, 2
# threads, activations wide enough that its kernels open parallel regions)
# trained 8 steps with LOOM_CPU_SPIN unset and =step: every step's loss
# (%.17g) and the weights exported after (--export) must be the same
# bytes. The variable changes how libgomp's threads wait, never how work is
# split.
set -u
EX=$1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/spin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 400); do
	echo "the cat sat on the mat. the dog sat on the log. $((i % 7)) cats, $((i % 5)) dogs."
done >"$tmp/text.txt"
args=(--data "$tmp/text.txt" --layers 2 --heads 4 --embd 128 --context 64 --batch-size 4
      --device cpu --threads 2 --max-steps 8 --log-interval 8 --sample 0 --val-interval 0)
fail=0
for mode in default step; do
	if [ $mode = step ]; then export LOOM_CPU_SPIN=step; else unset LOOM_CPU_SPIN; fi
	if ! "$EX" "${args[@]}" --loss-file "$tmp/loss.$mode" --export "$tmp/w.$mode" \
		>"$tmp/log.$mode" 2>&1; then
		echo "FAIL: gpt_ddp ($mode) exited non-zero:"
		tail -5 "$tmp/log.$mode"
		exit 1
	fi
done
n=$(wc -l <"$tmp/loss.default")
if [ "$n" -ne 8 ]; then
	echo "FAIL: $n losses written, 8 expected"
	fail=1
fi
if ! cmp -s "$tmp/loss.default" "$tmp/loss.step"; then
	echo "FAIL: the losses differ (default | LOOM_CPU_SPIN=step):"
	paste "$tmp/loss.default" "$tmp/loss.step"
	fail=1
fi
if ! cmp "$tmp/w.default" "$tmp/w.step"; then
	echo "FAIL: the weights after 8 steps differ"
	fail=1
fi
[ $fail = 0 ] && echo "PASS: 8 losses and $(stat -c %s "$tmp/w.default") bytes of weights the same"
exit $fail
