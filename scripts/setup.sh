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
# also assemble with it and read its SASS.
jit_ptxas=$(sed -n 's/^pub const JIT_PTXAS_VERSION: &str = "\(.*\)";/\1/p' ptx-builder/src/lib.rs)
install_tool() {  # DIR WHEEL TOOL
  [ -x ".tools/$1/nvidia/cu13/bin/$3" ] && return 0
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target ".tools/$1" "$2" \
    || echo "warning: could not install $2; the checks that need it will be skipped"
}
install_tool ptxas-jit "nvidia-cuda-nvcc==$jit_ptxas" ptxas
install_tool nvdisasm nvidia-cuda-nvdisasm nvdisasm
