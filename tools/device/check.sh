#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, by the device tool:
#
#   run(command="bash tools/device/check.sh", carry=[".whl"], timeout_s=540)
#
# after `bash tools/device/fetch_wheels.sh` here. One script, each step bounded, every
# result written under $OUT (what the tool brings back):
#   env.txt          the card, the driver, the versions, what imports;
#   cuda_tests.txt   the CUDA tests (tests marked `cuda`), each with its result (-rA);
#   nccl_probe.txt   what NCCL does with two processes on one GPU (the collector refuses it);
#   bench_cuda.txt   benchmarks/bench_cuda.py on the GPU, beside TorchRL (and bench_cuda.json).
# A step that fails is recorded and the next one still runs; the exit status is the tests'.
set -uo pipefail
OUT="${OUT:-/tmp/device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD"

{
    nvidia-smi || true
    nproc
    python3 - <<'PY'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("nccl", torch.distributed.is_nccl_available() and torch.cuda.nccl.version())
for name in ("tensordict", "gymnasium", "torchrl", "anyio", "trio", "uvloop", "aiocollect"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "FAILED:", type(exc).__name__, exc)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The suite turns warnings into errors; the GPU image's torch is not the one the suite pins,
# so its deprecation notices are shown here instead of failing the tests.
timeout 300 python3 -m pytest -p no:cacheprovider -q -rA -m cuda --timeout 150 \
    -W ignore::DeprecationWarning -W ignore::UserWarning -W ignore::FutureWarning \
    tests/test_cuda.py tests/test_async_batched.py tests/workers/test_lifecycle.py \
    tests/distributed/test_twins_and_cuda.py > "$OUT/cuda_tests.txt" 2>&1
tests_rc=$?
tail -40 "$OUT/cuda_tests.txt"

timeout 90 python3 tools/device/nccl_same_gpu.py > "$OUT/nccl_probe.txt" 2>&1
echo "nccl probe exit $?" >> "$OUT/nccl_probe.txt"
cat "$OUT/nccl_probe.txt"

timeout 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.txt" 2>&1
echo "bench_cuda exit $?" >> "$OUT/bench_cuda.txt"
tail -30 "$OUT/bench_cuda.txt"
exit "$tests_rc"
