#!/usr/bin/env bash
# The CUDA target's checks on a machine with an NVIDIA GPU, nvcc and PyTorch with CUDA:
#   1. the device tests (tests/test_cuda_device.py: every corpus kernel on the GPU against
#      OpenMP, torch/CuPy arrays in place, deterministic reductions, checkpointed gradients,
#      compute-sanitizer), spread over pytest-xdist workers when it is installed, and the
#      GPU-present branches of tests/test_cuda.py;
#   2. the CUDA benchmark (benchmarks/cuda.py, 4096x4096 float32).
# Usage: bash benchmarks/gpu_check.sh [LOG_DIR]   (logs and the device's description go there)
set -u -o pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu-logs}
mkdir -p "$logs"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version | tail -1
  "${CC:-gcc}" --version | head -1
  "$python" -c "import sys, numpy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$logs/device.txt"
workers=()
if "$python" -c "import xdist" 2>/dev/null; then
  workers=(-n "$(( $(nproc) < 16 ? $(nproc) : 16 ))")
fi
status=0
timeout 240 "$python" -m pytest -q -p no:cacheprovider "${workers[@]}" tests/test_cuda_device.py \
  "tests/test_cuda.py::test_without_a_gpu_target_cuda_raises_device_error" \
  "tests/test_cuda.py::test_nvcc_builds_a_loadable_library" 2>&1 | tee "$logs/tests.log" | tail -40 \
  || status=1
timeout 180 "$python" benchmarks/cuda.py --size 4096 --repeats 21 2>&1 | tee "$logs/bench.log" \
  || status=1
exit $status
