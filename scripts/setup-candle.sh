#!/usr/bin/env bash
# One-time setup for building candle-flash-attn3 on a machine without a CUDA toolkit or
# GPU (CI's kind). Our kernels need none of this; candle's `cuda` feature does:
#  - candle-kernels compiles candle's own CUDA kernels with nvcc: nvcc, its headers and
#    CCCL (`nv/target`, which cuda_fp16.h includes) from PyPI, pinned, into .tools/cuda;
#  - cudarc, as candle configures it, links libcuda, libnvrtc, libcurand, libcublas and
#    libcublasLt at build time. Link stubs stand in for them here: shared objects that
#    export the functions cudarc binds, under the CUDA 13 sonames, so the binaries load
#    the real libraries on the GPU machine (the driver's libcuda.so.1 and the cu13
#    wheels PyTorch ships there; scripts/candle-device-env.sh points at them). The CUDA
#    runtime, which candle's MoE kernels link, is the real one from the nvcc wheels.
#    Every stub function returns 100 (CUDA_ERROR_NO_DEVICE), so on this machine the
#    binaries also run (with scripts/candle-env.sh's LD_LIBRARY_PATH): candle finds no
#    GPU, the GPU tests say they are skipped, and the others run.
# Then `source scripts/candle-env.sh` and build in candle-flash-attn3/. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.tools/cuda
cu=$root/nvidia/cu13
# The toolkit of the GPU machine's driver JIT (CUDA 13.0): candle loads its kernels as
# PTX, and a driver rejects PTX from a newer toolkit than its own.
v=$(sed -n 's/^pub const JIT_PTXAS_VERSION: &str = "\(.*\)";/\1/p' ptx-builder/src/lib.rs)
if ! "$cu/bin/nvcc" --version 2>/dev/null | grep -q "V$v$" || [ ! -e "$cu/include/cccl/nv/target" ]; then
  rm -rf "$root"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$root" \
    "nvidia-cuda-nvcc==$v" "nvidia-cuda-crt==$v" "nvidia-cuda-runtime==$v" "nvidia-nvvm==$v" nvidia-cuda-cccl==13.0.85
fi
# cudarc's bindings as the candle crate's lockfile pins them.
cargo fetch --quiet --manifest-path candle-flash-attn3/Cargo.toml
cudarc=$(cargo metadata --format-version 1 --manifest-path candle-flash-attn3/Cargo.toml |
  python3 -c 'import json, os, sys; m = json.load(sys.stdin); print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"] == "cudarc"))')
stubs=$cu/lib/stubs
mkdir -p "$stubs"
# lib, soname, cudarc's bindings, prefix of the library's own symbols
while read -r lib soname mod prefix; do
  src=$(mktemp --suffix .c)
  grep -oP '^\s+fn \K\w+(?=\()' "$cudarc/src/$mod/sys/mod.rs" | grep "^$prefix" | sort -u | sed 's/.*/int &(void) { return 100; }/' >"$src"
  [ -s "$src" ] || { echo "error: no $lib symbols found in $cudarc/src/$mod/sys/mod.rs" >&2; exit 1; }
  cc -shared -fPIC -Wl,-soname,"$soname" -o "$stubs/lib$lib.so" "$src"
  ln -sf "lib$lib.so" "$stubs/$soname"
  rm -f "$src"
done <<'EOF'
cuda libcuda.so.1 driver cu
nvrtc libnvrtc.so.13 nvrtc nvrtc
curand libcurand.so.10 curand curand
cublas libcublas.so.13 cublas cublas
cublasLt libcublasLt.so.13 cublaslt cublasLt
EOF
# candle-kernels' static MoE library needs the CUDA runtime by its link name.
ln -sf ../libcudart.so.13 "$stubs/libcudart.so"
echo "candle build setup done: source scripts/candle-env.sh, then cargo test --manifest-path candle-flash-attn3/Cargo.toml"
