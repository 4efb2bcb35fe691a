#!/usr/bin/env bash
# One-time setup of a fresh machine: the pinned Rust toolchain (rust-toolchain.toml) and
# ptxas from PyPI (no CUDA toolkit or GPU needed) for the PTX checks. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
rustup toolchain install "$toolchain" --profile minimal --component rust-src,llvm-tools
if ! python3 -c 'import nvidia, os, sys; sys.exit(0 if any(os.path.exists(os.path.join(p, "cu13/bin/ptxas")) for p in nvidia.__path__) else 1)' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc || echo "warning: could not install ptxas (nvidia-cuda-nvcc); the ptxas check will be skipped"
fi
# The ptxas of the driver JIT that runs the kernels on the lent H100 (CUDA 13.0, driver
# 580; ptx_builder::JIT_PTXAS_VERSION) and nvdisasm, pinned in .tools/: the PTX checks
# also assemble with it and read its SASS. A wrong or partial install is replaced.
jit_ptxas=$(sed -n 's/^pub const JIT_PTXAS_VERSION: &str = "\(.*\)";/\1/p' ptx-builder/src/lib.rs)
[ -n "$jit_ptxas" ] || { echo "error: JIT_PTXAS_VERSION not found in ptx-builder/src/lib.rs" >&2; exit 1; }
install_tool() {  # DIR TOOL WHEEL VERSION
  local bin=".tools/$1/nvidia/cu13/bin/$2"
  "$bin" --version 2>/dev/null | grep -q "V$4\$" && return 0
  rm -rf ".tools/$1"  # pip --target does not replace an older or partial install
  if ! PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
      --target ".tools/$1" "$3==$4" || [ ! -x "$bin" ]; then
    echo "warning: could not install $3 $4; the checks that need it will be skipped"
  fi
}
install_tool ptxas-jit ptxas nvidia-cuda-nvcc "$jit_ptxas"
install_tool nvdisasm nvdisasm nvidia-cuda-nvdisasm 13.5.37
