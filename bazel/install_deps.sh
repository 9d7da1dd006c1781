#!/usr/bin/env bash
# Installs the Debian packages loom builds and tests with, and only those that
# are missing, so a second run is quick and touches nothing. Used by .ci/run on
# a fresh machine and by hand on a new workstation (as root, or with sudo).
set -euo pipefail

PACKAGES=(
	bazel-bootstrap      # Bazel 4.2.3, the build
	bazel-rules-java     # @rules_java, which Bazel 4 loads even for C
	libcriterion-dev     # the test framework
	libdnnl-dev          # oneDNN: CPU matrix products, JIT kernels picked by instruction set
	libopenblas-dev      # CPU matrix products on the portable path, and f64
	libopenmpi-dev       # comm/: MPI backend and bootstrap
	openmpi-bin          # mpirun for the multi-process tests
	zlib1g-dev           # checkpoint CRC32, gzip IDX files
	libjansson-dev       # JSON: safetensors headers, the --metrics log
	clang                # tests/fuzz: libFuzzer targets (gcc has no libFuzzer)
	graphviz             # tests/engine/test_report renders --dump-plan output with dot
	procps               # pkill (tests/comm stops and resumes a frozen rank's children)
	iproute2             # ip netns (tests/comm's two-host case; it skips without root)
	python3              # tests/comm's stand-in for torchrun's TCP store
	python3-matplotlib   # tools/plot_metrics and its test
	slurmctld            # tests/comm:test_slurm starts a private Slurm: the controller,
	slurmd               # the node daemon,
	slurm-client         # srun, salloc, sinfo
	munge                # and Slurm's authentication
	dataset-fashion-mnist # data for the examples and the end-to-end tests
	fortunes             # gpt_ddp's default text (English prose)
	pkg-config
	ca-certificates
)

die() {
	echo "install_deps: $*" >&2
	exit 1
}

# "install ok installed" is the only state in which a package is usable; a
# half-configured or removed-but-config-kept package counts as missing.
is_installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script expects Debian 12"

missing=()
for p in "${PACKAGES[@]}"; do
	is_installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
	echo "install_deps: installing ${missing[*]}"
	SUDO=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 ||
			die "need root (or sudo) to install: ${missing[*]}"
		SUDO=(sudo -n)
	fi
	export DEBIAN_FRONTEND=noninteractive
	"${SUDO[@]}" apt-get update -q </dev/null ||
		die "apt-get update failed (is Debian's package archive reachable?)"
	"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null ||
		die "apt-get install failed for: ${missing[*]}"
	for p in "${missing[@]}"; do
		is_installed "$p" || die "$p is still not installed after apt-get install"
	done
else
	echo "install_deps: all ${#PACKAGES[@]} packages already installed"
fi

# --version answers without starting a server, so this is cheap; it catches a
# missing or broken bazel before a long build does. (Debian's bootstrap build
# reports "bazel no_version", so the text is shown, not checked.)
command -v bazel >/dev/null 2>&1 || die "bazel not on PATH after installing bazel-bootstrap"
version=$(bazel --version 2>&1) || die "bazel does not run: $version"
echo "install_deps: ok ($version at $(command -v bazel))"
