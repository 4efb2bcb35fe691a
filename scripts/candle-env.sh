# Source this (after scripts/setup-candle.sh) to build candle-flash-attn3 here: nvcc and
# the link stubs of .tools/cuda, the GPU candle compiles its kernels for (there is none to
# ask here), and the stubs as the libraries its binaries load (so they run and find no
# GPU; on the GPU machine, source scripts/candle-device-env.sh instead).
_fa3_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CUDA_HOME="$_fa3_root/.tools/cuda/nvidia/cu13"
export PATH="$CUDA_HOME/bin:$PATH"
export CUDA_COMPUTE_CAP=90
export LD_LIBRARY_PATH="$CUDA_HOME/lib/stubs:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _fa3_root
