#!/usr/bin/env bash
# On the GPU machine: the bindings with user-defined variants, from .device/bindings.tgz
# (scripts/bindings-variant-prep.sh): the PyTorch extension's wheel installed and its tests
# (python/tests/test_torch.py, the variant tests among them; PYTEST_ARGS="-k variant"
# runs those alone), then candle-flash-attn3's test binaries (its variant tests among
# them), both with the example's module as FA3_VARIANTS_PTX. Logs in $OUT.
cd "$(dirname "$0")/.."
source scripts/device-env.sh
if [ -f .device/bindings.tgz ]; then tar xzf .device/bindings.tgz -C .device || exit 1; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
export FA3_VARIANTS_PTX=$PWD/.device/bindings/variants.ptx
python3 -m pip install --no-deps --force-reinstall .device/bindings/flash_attn3_torch-*.whl > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
# From /tmp: `flash_attn3_torch` is the installed wheel, not python/'s sources (no library there).
(cd /tmp && PYTHONUNBUFFERED=1 timeout 420 python3 -m pytest -v -rs ${PYTEST_ARGS:-} "$OLDPWD/python/tests/test_torch.py") > "$OUT/pytest.log" 2>&1 || status=1
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/pytest.log"
if source scripts/candle-device-env.sh; then
  for t in .device/bindings/candle/*; do
    FA3_REQUIRE_GPU=1 timeout 300 "$t" --test-threads 1 >> "$OUT/candle_tests.txt" 2>&1 || status=1
  done
  grep -E "^test |test result|SKIPPED|panicked" "$OUT/candle_tests.txt"
else
  status=1
fi
exit $status
