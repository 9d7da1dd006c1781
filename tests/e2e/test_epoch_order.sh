#!/usr/bin/env bash
# tests/e2e/test_epoch_order.sh — every epoch of a training example feeds
# the same set of samples in a new order (the sampler's per-epoch shuffle,
# DistributedSampler.set_epoch): examples/cifar_ddp on 64 synthetic images,
# unaugmented, prints each epoch's order hash and set hash
# (LOOM_TEST_EPOCH_ORDER). Prints "N passed, N failed".
set -u
EX=$1
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; shift; printf '%s\n' "$@" | head -20 | sed 's/^/     /'; }
distinct() { # PREFIX FIELD OUTPUT: how many different values FIELD takes
	sed -n "s/^$1epoch [0-9]* order \([0-9a-f]*\) set \([0-9a-f]*\)$/\\$2/p" <<<"$3" | sort -u | wc -l
}
flags=(--synthetic --train-images 64 --test-images 16 --batch-size 16 --epochs 3 --no-augment
	--depth 18 --width 4 --device cpu)
export OMP_NUM_THREADS=1 LOOM_TEST_EPOCH_ORDER=1 LOOM_COMM_TIMEOUT_S=60
# Under ASan: Open MPI's own exit-time leaks are suppressed by library, as
# tests/lib/mp_harness.sh does (its plugins kept loaded so that their frames
# have names), never loom's.
if [ -n "${2:-}" ]; then
	supp=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
	export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$supp:print_suppressions=0"
	export OMPI_MCA_mca_base_component_disable_dlclose=1
	[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
fi

for how in single nproc; do
	if [ $how = single ]; then
		out=$("$EX" "${flags[@]}" 2>&1) prefix=""
	else
		out=$("$EX" --nproc 2 "${flags[@]}" 2>&1) prefix='\[rank 0\] '
	fi
	n=$(grep -c "^${prefix}epoch [0-9]* order " <<<"$out")
	[ "$n" -eq 3 ] && ok "$how: three epochs report their order" || bad "$how: epochs reported" "$n" "$out"
	[ "$(distinct "$prefix" 1 "$out")" -eq 3 ] && ok "$how: each epoch in another order" ||
		bad "$how: each epoch in another order" "$out"
	# One process sees every sample each epoch; a rank of two sees its
	# share of a global shuffle, a different half each epoch.
	[ $how = nproc ] && continue
	[ "$(distinct "$prefix" 2 "$out")" -eq 1 ] && ok "$how: every epoch the same samples" ||
		bad "$how: every epoch the same samples" "$out"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
