#!/usr/bin/env bash
# Builds the PyTorch extension's wheel into dist/: the C ABI library (cargo, release)
# copied into the Python package, then a py3-none-linux_x86_64 wheel. Installs on a GPU
# machine with `pip install --no-deps dist/flash_attn3_torch-*.whl` (no compiler there).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import setuptools, wheel" 2>/dev/null || python3 -m pip install -q setuptools wheel
cargo build --release -p flash-attn3-capi
cp target/release/libflash_attn3_capi.so python/flash_attn3_torch/
strip python/flash_attn3_torch/libflash_attn3_capi.so
rm -rf python/build
python3 -m pip wheel ./python --no-deps --no-build-isolation -w dist -q
ls -la dist/flash_attn3_torch-*.whl
