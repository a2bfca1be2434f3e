#!/usr/bin/env bash
# The GPU checks in one short script: installs CuPy, runs the gpu-marked tests (every layer check
# on CuPy arrays) and the benchmark on the GPU, and writes the logs to ${OUT:-results/gpu}.
# Usage, from the repository root on a machine with an NVIDIA GPU:  bash scripts/gpu_check.sh
set -uo pipefail
out=${OUT:-results/gpu}
mkdir -p "$out"
python3 -m venv .venv-gpu
. .venv-gpu/bin/activate
pip install -q -e ".[dev,gpu]" 2>&1 | tail -2
{
  echo "# device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import cupy, numpy, jax; print('cupy', cupy.__version__, 'cuda', cupy.cuda.runtime.runtimeGetVersion(), 'numpy', numpy.__version__, 'jax', jax.__version__)"
} 2>&1 | tee "$out/device.txt"
GRADLAB_QUIET=1 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tee "$out/tests.txt"
tests=${PIPESTATUS[0]}
GRADLAB_QUIET=1 GRADLAB_RESULTS="$out" python -m experiments bench --backend cupy 2>&1 | tee "$out/bench.txt"
bench=${PIPESTATUS[0]}
echo "gpu tests exit $tests, gpu bench exit $bench"
exit $(( tests || bench ))
