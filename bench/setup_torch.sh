#!/usr/bin/env bash
# Sets up the PyTorch 2.x reference that bench/yardstick.sh compares loom
# with: a virtual environment OUTSIDE the repo (never a dependency of the
# build or the tests) holding torch and torchvision from PyPI at the exact
# versions below (bench/RESULTS.md records the versions with every table).
#   bench/setup_torch.sh [venv]          (default $TORCH_VENV or /work/venv-torch)
# A venv that already imports torch is reused as it is, never deleted,
# upgraded or downgraded (other benchmarks may share it); only a missing
# torchvision is added, pinned, with the torch it has held fixed. PyPI's
# Linux wheel of torch brings CUDA libraries too (a few GiB); the benchmarks
# use its CPU path. PYPI_INDEX=https://download.pytorch.org/whl/cpu takes
# the CPU-only wheels where the plain index is not reachable.
# The bench scripts define their models themselves (the same layers as
# examples/models.c), so torchvision is installed for completeness only.
# torchao brings torch_gpt.py --float8 (issue 42's FP8 baseline,
# convert_to_float8_training); like torchvision it is added to a reused
# venv with its torch held fixed.
set -euo pipefail
TORCH_VERSION=2.15.0
TORCHVISION_VERSION=0.29.2 # requires torch >= 2.14.0
TORCHAO_VERSION=0.18.0
venv=${1:-${TORCH_VENV:-/work/venv-torch}}
py=${PYTHON:-python3}
idx=()
[ -n "${PYPI_INDEX:-}" ] && idx=(--index-url "$PYPI_INDEX")

version() { # module -> its version in the venv, or nothing
	[ -x "$venv/bin/python" ] &&
		"$venv/bin/python" -c "import $1; print($1.__version__.split('+')[0])" 2>/dev/null || true
}

t=$(version torch)
if [ -n "$t" ]; then
	echo "setup_torch: $venv already has torch $t; reused as it is"
	[ "$t" = "$TORCH_VERSION" ] ||
		echo "setup_torch: note: not the pinned torch $TORCH_VERSION; the tables record what ran"
	if [ -z "$(version torchvision)" ]; then
		"$venv/bin/pip" install --quiet "${idx[@]}" "torch==$t" "torchvision==$TORCHVISION_VERSION"
	fi
	if [ -z "$(version torchao)" ]; then
		"$venv/bin/pip" install --quiet "${idx[@]}" "torch==$t" "torchao==$TORCHAO_VERSION"
	fi
else
	[ -d "$venv" ] || "$py" -m venv "$venv"
	"$venv/bin/pip" install --quiet "${idx[@]}" "torch==$TORCH_VERSION" \
		"torchvision==$TORCHVISION_VERSION" "torchao==$TORCHAO_VERSION" numpy
fi
echo "setup_torch: $venv: torch $(version torch), torchvision $(version torchvision)," \
	"torchao $(version torchao), numpy $(version numpy)"
