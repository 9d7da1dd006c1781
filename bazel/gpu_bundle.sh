#!/usr/bin/env bash
# bazel/gpu_bundle.sh — builds here (no GPU needed) what the GPU suite runs
# and gathers it into .gpu-bundle/: the binaries, the CUDA plugin
# libloom_cuda.so when the build has that target, the non-CUDA shared
# libraries they load (found with ldd: libcriterion and its deps, OpenBLAS,
# libgomp, libz, ...; glibc and the CUDA libraries stay the host's), the
# suite and its summariser, Open MPI's runtime (for the two-rank rows), the
# PyTorch side, Fashion-MNIST, and run.sh.
# Copy the folder to a GPU host and run ./run.sh (with $OUT set, the logs
# and the table go there).
set -euo pipefail
cd "$(dirname "$0")/.."
ob=${LOOM_OUTPUT_BASE:-/root/.cache/bazel_cuda}
out=.gpu-bundle
bz() { bazel --output_base="$ob" "$@"; }

targets=(//tests/engine/cuda:test_device //tests/engine/cuda:test_cuda_ops)
for t in //examples:mnist_ddp //examples:gpt_ddp //examples:resnet50_synthetic \
	//bench:bench_convnet //tests/ddp:pipe_worker //engine/cuda:libloom_cuda.so \
	//tests/engine/cuda:libloom_kprof.so; do
	if bz query "$t" >/dev/null 2>&1; then
		targets+=("$t")
	else
		echo "gpu_bundle: $t is not a target of this tree; left out" >&2
	fi
done
bz build --jobs="${LOOM_JOBS:-2}" "${targets[@]}"
bin_dir=$(bz info bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
built=()
for t in "${targets[@]}"; do
	pkg=${t#//}
	pkg=${pkg%%:*}
	name=${t##*:}
	cp -L "$bin_dir/$pkg/$name" "$out/bin/$name"
	built+=("$bin_dir/$pkg/$name")
done

# Everything ldd resolves for the built binaries (tests link bazel's own
# shared libraries through a runfiles rpath), less glibc (the host's must
# match its kernel and loader) and CUDA (the host's must match its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink|libloom_cuda)'
for b in "${built[@]}"; do
	ldd "$b" | awk '/=> \// { print $1, $3 }' | while read -r so path; do
		if ! [[ $so =~ $skip ]]; then
			cp -Ln "$path" "$out/lib/$so" 2>/dev/null || true
		fi
	done
done
# Open MPI's runtime, for the rows of two ranks (the launcher's env://
# group: rank 0 starts ompi-server, each rank's MPI_Init starts an orted):
# the GPU host's image has no Open MPI. Its programs, components (which it
# loads by path) and help texts, with PMIx's, relocated by run.sh through
# OPAL_PREFIX and PMIX_PREFIX; the libraries they load join lib/.
ompi=/usr/lib/x86_64-linux-gnu/openmpi
pmix=/usr/lib/x86_64-linux-gnu/pmix2
if command -v ompi-server >/dev/null 2>&1 && [ -d "$ompi/lib/openmpi3" ]; then
	mkdir -p "$out/mpi/bin" "$out/mpi/lib/x86_64-linux-gnu/openmpi" "$out/mpi/share"
	cp -L "$(command -v ompi-server)" "$(command -v orted)" "$out/mpi/bin/"
	cp -rL "$ompi/lib" "$out/mpi/lib/x86_64-linux-gnu/openmpi/"
	rm -rf "$out/mpi/lib/x86_64-linux-gnu/openmpi/lib/pkgconfig"
	[ -d /usr/share/openmpi ] && cp -rL /usr/share/openmpi "$out/mpi/share/"
	if [ -d "$pmix/lib" ]; then
		mkdir -p "$out/mpi/pmix2"
		cp -rL "$pmix/lib" "$out/mpi/pmix2/"
		[ -d "$pmix/share" ] && cp -rL "$pmix/share" "$out/mpi/pmix2/"
	fi
	find "$out/mpi" -type f \( -name '*.so*' -o -perm -u+x \) | while read -r f; do
		ldd "$f" 2>/dev/null | awk '/=> \// { print $1, $3 }' | while read -r so path; do
			if ! [[ $so =~ $skip ]]; then
				cp -Ln "$path" "$out/lib/$so" 2>/dev/null || true
			fi
		done
	done
else
	echo "gpu_bundle: no Open MPI here (ompi-server, $ompi): the two-rank rows will need the host's" >&2
fi
cp tests/engine/cuda/gpu_suite.sh tests/engine/cuda/gpu_summary.sh tests/engine/cuda/gpu_speed.sh \
	tests/engine/cuda/gpu_versus.py tests/engine/cuda/gpu_kernels.py tests/engine/cuda/gpu_kprof.sh \
	tests/engine/cuda/gpu_ddp_shared.sh "$out/"
mkdir -p "$out/bench"
cp bench/torch_gpu.py bench/torch_convnet.py bench/torch_modes.py bench/torch_gpt.py "$out/bench/"
# Fashion-MNIST travels too, so that the suite can train the ConvNet on the
# GPU and report its accuracy, with gpt_ddp's text (Debian's fortunes, about
# 2.5 MB of prose: one file, for loom and bench/torch_gpt.py alike). Both go
# into the xz payload below unpacked (datasets/mnist.c reads the raw files
# first): xz makes 27 MB of what gzip made 31 and the text a third of its
# size, room for the torchao wheel under the device tool's 64 MiB.
mkdir -p "$out/data"
data=${LOOM_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if [ -d "$data" ]; then
	for f in "$data"/*-ubyte*; do
		name=$(basename "$f" .gz)
		case $f in
		*.gz) gzip -dc "$f" >"$out/data/$name" ;;
		*) cp -L "$f" "$out/data/$name" ;;
		esac
	done
fi
text=${LOOM_TEXT_DIR:-/usr/share/games/fortunes}
if [ -d "$text" ]; then
	find "$text" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
		xargs -0 cat >"$out/data/fortunes.txt"
fi

# torchao, for bench/torch_gpt.py --float8 (issue 42's FP8 baseline): the
# GPU host's PyTorch image lacks it and can fetch nothing, so its wheel
# travels (the version bench/setup_torch.sh pins, built for torch 2.11 as
# the host has), and run.sh installs it into the bundle's site/ when that
# Python cannot import torchao. LOOM_BUNDLE_TORCHAO=0 leaves it out; where
# pip cannot reach PyPI here it is left out with a note.
if [ "${LOOM_BUNDLE_TORCHAO:-1}" != 0 ]; then
	ao=$(sed -n 's/^TORCHAO_VERSION=\([0-9.]*\).*/\1/p' bench/setup_torch.sh)
	mkdir -p "$out/whl"
	if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
		--platform manylinux_2_17_x86_64 -d "$out/whl" "torchao==$ao" >/dev/null 2>&1; then
		echo "gpu_bundle: torchao $ao could not be fetched here; the --float8 rows will say so" >&2
		rm -rf "$out/whl"
	fi
fi

# llm.c's train_gpt2cu, the GPT's reference on the GPU (issue 30's goal),
# where LOOM_LLMC_BIN names one built beside the repo (default
# ../llmc/train_gpt2cu, where bench/gpu/build_llmc.sh's README line puts it;
# never fetched or built here); its train.bin and val.bin from
# LOOM_LLMC_DATA, else made here from the text's bytes (llm.c's token files:
# magic 20240520, version 1, the count, uint16 ids; nine tenths for
# training), both inside the payload (llmc/).
llmc_bin=${LOOM_LLMC_BIN:-../llmc/train_gpt2cu}
if [ -x "$llmc_bin" ]; then
	cp -L "$llmc_bin" "$out/bin/train_gpt2cu"
	mkdir -p "$out/llmc"
	if [ -n "${LOOM_LLMC_DATA:-}" ]; then
		cp -L "$LOOM_LLMC_DATA"/train.bin "$LOOM_LLMC_DATA"/val.bin "$out/llmc/"
	elif [ -f "$out/data/fortunes.txt" ]; then
		python3 bench/llmc_tokens.py "$out/data/fortunes.txt" "$out/llmc"
	fi
else
	echo "gpu_bundle: no llm.c ($llmc_bin; bench/gpu/build_llmc.sh builds it): its rows will say N/A" >&2
fi

# bin/, lib/ and data/ travel as one archive (oneDNN and OpenBLAS alone are
# 76 MB): xz makes the programs 18 MB where gzip makes 32, so that with the
# data and the CUDA plugin the bundle stays under the device tool's 64 MiB.
# run.sh unpacks it afresh on every run, so a stale bin/ is never run. Open
# MPI's runtime (mpi/) and llm.c's token files (llmc/) go in the same archive.
mpi=()
[ -d "$out/mpi" ] && mpi=(mpi)
[ -d "$out/llmc" ] && mpi+=(llmc)
if command -v xz >/dev/null 2>&1; then
	tar -C "$out" -cf - bin lib data "${mpi[@]}" | xz -T"${LOOM_JOBS:-2}" -6 >"$out/payload.tar.xz"
else
	tar -C "$out" -czf "$out/payload.tar.gz" bin lib data "${mpi[@]}"
fi
rm -rf "$out/bin" "$out/lib" "$out/data" "$out/mpi" "$out/llmc"
git rev-parse --short HEAD >"$out/COMMIT" 2>/dev/null || echo unknown >"$out/COMMIT"

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the loom GPU suite from this folder: bin/ and lib/ are unpacked
# afresh from payload.tar.xz (or .gz) every time (a bin/ left by an earlier bundle
# is wiped, never run), into a copy of this folder if it is read-only.
# cuBLASLt, cuDNN and NCCL come from the host: $CUDA_HOME/lib64,
# /usr/local/cuda/lib64 and, with PyTorch installed, its
# site-packages/nvidia/*/lib. The CUDA plugin is bin/libloom_cuda.so
# (LOOM_CUDA_PLUGIN). Logs and the table: $OUT if set, else results/.
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -w "$here" ]; then
	tmp=$(mktemp -d)
	cp -r "$here"/. "$tmp"/
	here=$tmp
fi
rm -rf "$here/bin" "$here/lib" "$here/data" "$here/mpi" "$here/llmc" "$here/site"
payload=$(ls "$here"/payload.tar.* 2>/dev/null | head -n 1)
tar -C "$here" -xf "$payload" 2>/dev/null ||
	python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
		"$payload" "$here" ||
	{ echo "run.sh: cannot unpack ${payload:-payload.tar.*} (no tar with xz, no python3)" >&2; exit 1; }
echo "loom bundle of commit $(cat "$here/COMMIT" 2>/dev/null)"
path=$here/lib
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
	[ -d "$d" ] && path=$path:$d
done
for py in python3 python; do
	command -v "$py" >/dev/null 2>&1 || continue
	sp=$("$py" -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null) || continue
	for s in $sp; do
		for d in "$s"/nvidia/*/lib; do
			[ -d "$d" ] && path=$path:$d
		done
	done
	break
done
# Open MPI from the bundle (the binaries link its libmpi): its programs
# first on PATH, its install tree relocated here.
if [ -d "$here/mpi" ]; then
	export OPAL_PREFIX=$here/mpi PMIX_PREFIX=$here/mpi/pmix2 PMIX_INSTALL_PREFIX=$here/mpi/pmix2
	# PMIx looks for its components where it was installed whatever the
	# prefix says (a warning about pcompress otherwise).
	export PMIX_MCA_mca_base_component_path=$here/mpi/pmix2/lib/pmix PATH=$here/mpi/bin:$PATH
	path=$path:$here/mpi/lib/x86_64-linux-gnu/openmpi/lib:$here/mpi/pmix2/lib
fi
export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# torchao for bench/torch_gpt.py --float8, from the bundle's wheel where the
# host's Python lacks it (its PyTorch image has none and fetches nothing).
if ls "$here"/whl/*.whl >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 &&
	! python3 -c 'import torchao' >/dev/null 2>&1; then
	[ -d "$here/site/torchao" ] ||
		python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
			--target "$here/site" "$here"/whl/*.whl >/dev/null 2>&1 ||
		echo "run.sh: torchao's wheel did not install; the --float8 rows will say so" >&2
	[ -d "$here/site/torchao" ] && export PYTHONPATH=$here/site${PYTHONPATH:+:$PYTHONPATH}
fi
[ -f "$here/bin/libloom_cuda.so" ] && export LOOM_CUDA_PLUGIN=$here/bin/libloom_cuda.so
# LOOM_BUNDLE_ENV_ONLY=1: runs its arguments (or a shell) in this environment instead
# (how the bundle's own Open MPI is tried on a host without one).
[ "${LOOM_BUNDLE_ENV_ONLY:-0}" = 1 ] && exec "${@:-bash}"
exec bash "$here/gpu_suite.sh" "$@"
RUN
chmod +x "$out/run.sh" "$out/gpu_suite.sh" "$out/gpu_summary.sh" "$out/gpu_speed.sh" \
	"$out/gpu_kprof.sh"
# The device tool carries at most 64 MiB, the working tree (the tracked
# files and the untracked ones git does not ignore) and the bundle
# together: past LOOM_BUNDLE_MAX_MIB (63) in all the bundle is refused
# here, loudly, rather than cut short on the GPU host's lease. (2026-12-06:
# 56.5 MiB of bundle with llm.c and torchao, 5.9 MiB of tree.)
kib() { awk '{ s += $1 } END { printf "%d", s / 1024 + 1 }'; }
size_kib=$(find "$out" -type f -printf '%s\n' | kib)
tree_kib=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null |
	xargs -0 stat -c %s 2>/dev/null | kib)
limit_kib=$((${LOOM_BUNDLE_MAX_MIB:-63} * 1024))
if [ $((size_kib + tree_kib)) -gt "$limit_kib" ]; then
	echo "gpu_bundle: FAIL: $out is $((size_kib / 1024)) MiB and the working tree $((tree_kib / 1024)) MiB, over $((limit_kib / 1024)) MiB together (the device tool carries 64 MiB):" >&2
	du -sk "$out"/* | sort -rn | head -n 5 >&2
	rm -f "$out/run.sh" # not to be carried and run by mistake
	exit 1
fi
echo "bundle: $out ($(du -sh "$out" | cut -f1)): ${targets[*]}"
echo "on a GPU host: $out/run.sh (OUT=dir for the logs and the table)"
