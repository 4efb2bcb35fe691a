# Source this on the GPU machine before running candle-flash-attn3's binaries: candle links
# cuBLAS, cuRAND and NVRTC (CUDA 13 sonames, see scripts/setup-candle.sh); they are taken
# from the CUDA wheels installed with PyTorch there, the driver's libcuda from the system.
_fa3_cu13=$(python3 -c 'import nvidia, os; print(next(os.path.join(p, "cu13/lib") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13/lib"))))' 2>/dev/null) ||
  { echo "error: no nvidia/cu13/lib in this python's packages (pip install nvidia-cublas nvidia-curand nvidia-cuda-nvrtc)" >&2; return 1; }
export LD_LIBRARY_PATH="$_fa3_cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _fa3_cu13
