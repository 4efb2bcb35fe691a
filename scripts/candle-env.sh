# Source this (after scripts/setup-candle.sh) to build candle-flash-attn3: nvcc and the
# link stubs of .tools/cuda, and the GPU candle compiles its kernels for (there is none
# to ask here).
_fa3_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CUDA_HOME="$_fa3_root/.tools/cuda/nvidia/cu13"
export PATH="$CUDA_HOME/bin:$PATH"
export CUDA_COMPUTE_CAP=90
unset _fa3_root
