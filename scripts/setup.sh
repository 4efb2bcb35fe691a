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
