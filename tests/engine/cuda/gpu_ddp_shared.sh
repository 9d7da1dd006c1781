#!/usr/bin/env bash
# tests/engine/cuda/gpu_ddp_shared.sh — data parallelism at world 2 on one
# GPU: mnist_ddp --nproc 2 (two ranks of the launcher on the same device,
# where NCCL refuses two ranks, so the group opens no device communicator
# and the buckets and synchronised batch norm's sums go through host
# buffers over MPI: parallel/ddp_staged.c) against one process at the same
# global batch (100 = 2 x 50; the shards of a global batch are its images,
# and synchronised batch norm takes the global batch's statistics). 100
# steps at O0 with TF32 off and plain SGD (momentum 0.9 amplifies the
# drift: on the CPU, 8e-3 after 100 steps on random labels, against 3e-5
# without); the verdict compares the test loss after them: a relative
# difference within 1e-3 (the two runs sum in different orders: other GEMM
# and convolution shapes, the ranks' gradients added on the host, a batch
# norm summed over two halves) prints " OK ", else WRONG. Also WRONG: the world-2 run does not say the collectives are
# staged through host memory, or either run fails.
# usage: gpu_ddp_shared.sh BIN [--data DIR]
set -u
bin=$1
shift
common=(--device cuda "$@" --epochs 1 --max-steps 100 --log-interval 50 --opt-level O0 --tf32 off \
	--momentum 0)
one=$("$bin/mnist_ddp" "${common[@]}" --batch-size 100 2>&1)
rc1=$?
two=$("$bin/mnist_ddp" "${common[@]}" --batch-size 50 --nproc 2 --sync-bn 2>&1)
rc2=$?
sed 's/^/[world 1] /' <<<"$one"
echo "$two"
loss() { grep -ao 'test loss [0-9.]*' <<<"$1" | tail -n 1 | sed 's/test loss //'; }
l1=$(loss "$one")
l2=$(loss "$two")
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ -z "$l1" ] || [ -z "$l2" ]; then
	echo "ERROR: world 1 rc $rc1 test loss '${l1}', world 2 rc $rc2 test loss '${l2}'"
	exit 1
fi
if ! grep -aq 'the collectives are staged through host memory' <<<"$two"; then
	echo "WRONG: the world-2 run on one GPU did not stage its collectives through host memory"
	exit 1
fi
rel=$(awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3g", d / (a > 0 ? a : 1) }')
if awk -v r="$rel" 'BEGIN { exit !(r <= 1e-3) }'; then
	echo "[world 2] OK test loss $l2, world 1 $l1: relative difference $rel (bound 1e-3)"
else
	echo "[world 2] WRONG test loss $l2, world 1 $l1: relative difference $rel (bound 1e-3)"
	exit 1
fi
