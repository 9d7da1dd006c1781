#!/usr/bin/env bash
# tests/examples/test_plot_metrics.sh — tools/plot_metrics on two small
# --metrics logs: a PNG comes out, titled with the runs (program, opt level,
# ranks, file) or with --title, the test loss drawn beside the training loss
# (one line per run that has a test set), a log that is not metrics refused.
# Needs matplotlib (Debian's python3-matplotlib: bazel/install_deps.sh).
# Prints "N passed, N failed".
set -u
P=$1
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/a.jsonl" <<'J'
{"type":"start","wall_s":0.5,"program":"mnist_ddp","backend":"cpu","opt_level":"O2","precision":"bf16","ranks":2,"batch_per_rank":50,"lr":0.05,"optimizer":"sgd"}
{"type":"step","wall_s":1.0,"step":10,"epoch":1,"loss":2.0,"accuracy":0.3,"lr":0.05,"images_per_s":900.0,"loss_scale":1.0,"skipped_steps":0,"ranks":2,"global_batch":100}
{"type":"step","wall_s":2.0,"step":20,"epoch":1,"loss":1.0,"accuracy":0.6,"lr":0.05,"images_per_s":950.0,"loss_scale":1.0,"skipped_steps":0,"ranks":2,"global_batch":100}
{"type":"epoch","wall_s":2.5,"epoch":1,"step":20,"test_loss":1.1,"test_accuracy":0.62,"train_s":2.0,"images_per_s":920.0,"loss_scale":1.0,"skipped_steps":0,"ranks":2}
{"type":"step","wall_s":3.5,"step":30,"epoch":2,"loss":0.8,"accuracy":0.7,"lr":0.05,"images_per_s":960.0,"loss_scale":1.0,"skipped_steps":0,"ranks":2,"global_batch":100}
{"type":"epoch","wall_s":4.0,"epoch":2,"step":30,"test_loss":0.9,"test_accuracy":0.7,"train_s":1.5,"images_per_s":930.0,"loss_scale":1.0,"skipped_steps":0,"ranks":2}
J
# A run without a test set: its epochs carry nulls.
sed -e 's/"test_loss":[0-9.]*/"test_loss":null/; s/"test_accuracy":[0-9.]*/"test_accuracy":null/' \
	-e 's/"ranks":2,"batch_per_rank"/"ranks":1,"batch_per_rank"/' "$tmp/a.jsonl" >"$tmp/b.jsonl"

if ! out=$("$P" "$tmp/one.png" "$tmp/a.jsonl" 2>&1); then
	bad "plot_metrics runs (matplotlib found)" "$out"
	echo "$pass passed, $fail failed"
	exit 1
fi
[ "$(head -c 8 "$tmp/one.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
	ok "one run: a PNG is written" || bad "one run: no PNG" "$out"
check "one run: titled with the run (program, opt level, ranks x batch, optimizer, file)" "$out" \
	"titled 'mnist_ddp: O2 bf16, 2 ranks x batch 50, sgd lr 0.05, cpu (a.jsonl)'" 1
check "one run: the test loss against steps" "$out" "test loss against step: 1 line$" 1
check "one run: the test loss against wall time" "$out" "test loss against wall time (s): 1 line$" 1
check "one run: the training loss too" "$out" "training loss against step: 1 line$" 1

out=$("$P" "$tmp/two.png" "$tmp/a.jsonl" "$tmp/b.jsonl=no test set" --title "O2 at 2 ranks against 1" 2>&1)
check "two runs, --title: the given title" "$out" "titled 'O2 at 2 ranks against 1'" 1
check "two runs: training loss for both" "$out" "training loss against step: 2 lines$" 1
check "two runs: test loss only for the run with a test set" "$out" "test loss against step: 1 line$" 1
out=$("$P" "$tmp/three.png" "$tmp/a.jsonl" "$tmp/b.jsonl" 2>&1)
check "two runs, no --title: both runs in the title" "$out" \
	"titled 'mnist_ddp: O2 bf16, 2 ranks .*(a.jsonl); mnist_ddp: O2 bf16, 1 rank x batch 50.*(b.jsonl)'" 1

echo '{"type":"start"}' >"$tmp/empty.jsonl"
out=$("$P" "$tmp/x.png" "$tmp/empty.jsonl" 2>&1)
rc=$?
[ $rc -ne 0 ] && check "a log without steps or epochs is refused, naming it" "$out" \
	"empty.jsonl: no step or epoch records" 1 || bad "a log without records: exit $rc" "$out"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
