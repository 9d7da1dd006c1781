#!/usr/bin/env bash
# tests/ddp/test_eval.sh — test accuracy summed over ranks equals one
# process evaluating the same weights: the correct count and the number of
# images exactly, the mean loss within rounding (1e-6 relative), at 2 and 3
# ranks on 1000 and 999 images with batch 64, so that shards are padded by
# the sampler (1000 at 3 ranks: 334 per rank, 2 repeats; 999 at 2: one) and
# last batches are ragged; and right after training at 2 ranks, when each
# rank's batch-norm statistics are its own. Also checks that the comparison
# catches a count that includes the padding. Prints "N passed, N failed".
set -u
W=$1
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup

out=$("$W" train "$tmp/w.ckpt" 2>&1)
check "one process trains and saves the weights" "$out" "rank 0: OK trained" 1

# figure OUTPUT: "correct C seen S loss L" of the line every rank printed,
# or nothing unless all of them agree.
figure() {
	local f
	f=$(sed -n 's/.*: OK eval world [0-9]* images [0-9]* batch [0-9]* \(.*\)/\1/p' <<<"$1" | sort -u)
	[ "$(wc -l <<<"$f")" -eq 1 ] && echo "$f"
}
# same_figure A B: equal counts, losses within 1e-6 relative.
same_figure() {
	[ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {
		split(a, x, " "); split(b, y, " ")
		d = x[6] - y[6]; if (d < 0) d = -d
		exit !(x[2] == y[2] && x[4] == y[4] && d <= 1e-6 * (y[6] < 0 ? -y[6] : y[6]))
	}'
}

for n in 1000 999; do
	one=$(figure "$("$W" eval "$tmp/w.ckpt" $n 2>&1)")
	if [[ "$one" =~ ^correct\ ([0-9]+)\ seen\ $n\  ]] && [ "${BASH_REMATCH[1]}" -gt $((n / 3)) ]; then
		ok "$n images, 1 process: every image once, above chance ($one)"
	else
		bad "$n images, 1 process: every image once, above chance" "got: '$one'"
	fi
	for np in 2 3; do
		raw=$("${MPIRUN[@]}" -np $np "$W" eval "$tmp/w.ckpt" $n 2>&1)
		got=$(figure "$raw")
		if same_figure "$got" "$one"; then
			ok "$n images, $np ranks: the summed figure equals 1 process ($got)"
		else
			bad "$n images, $np ranks: the summed figure equals 1 process" \
				"1 process: '$one'" "$np ranks: '$got'" "$raw"
		fi
	done
done

# After training at 2 ranks each rank's batch-norm running statistics are
# its own; the evaluation right after training must still be that of rank
# 0's model (the one it saves), as with DDP's broadcast_buffers.
raw=$("${MPIRUN[@]}" -np 2 "$W" train "$tmp/w2.ckpt" 1000 2>&1)
got=$(figure "$raw")
one=$(figure "$("$W" eval "$tmp/w2.ckpt" 1000 2>&1)")
if same_figure "$got" "$one"; then
	ok "trained at 2 ranks: the summed figure equals 1 process on rank 0's checkpoint ($got)"
else
	bad "trained at 2 ranks: the summed figure equals 1 process on rank 0's checkpoint" \
		"1 process: '$one'" "2 ranks: '$got'" "$raw"
fi

# The check notices a count inflated by the sampler's repeats.
one=$(figure "$("$W" eval "$tmp/w.ckpt" 1000 2>&1)")
got=$(figure "$("${MPIRUN[@]}" -np 3 "$W" eval "$tmp/w.ckpt" 1000 padding 2>&1)")
if [[ "$got" == *" seen 1002 "* ]] && ! same_figure "$got" "$one"; then
	ok "counting the 2 repeated images at 3 ranks is caught ($got)"
else
	bad "counting the 2 repeated images at 3 ranks is caught" "1 process: '$one'" \
		"3 ranks with repeats: '$got'"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
