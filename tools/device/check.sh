#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, by the device tool:
#
#   run(command="bash tools/device/check.sh", carry=[".whl"], timeout_s=450)
#
# after `bash tools/device/fetch_wheels.sh` here. One script, each step bounded, every
# result written under $OUT (what the tool brings back):
#   env.txt          the card, the driver, the versions, what imports; then each step's exit and time;
#   cuda_tests.txt   the CUDA tests (tests marked `cuda`), each with its result (-rA);
#   nccl_probe.txt   what NCCL does with two processes on one GPU (the collector refuses it);
#   bench_cuda.txt   benchmarks/bench_cuda.py on the GPU, beside TorchRL (and bench_cuda.json);
#   bench_paired.txt bench_cuda.py --paired: storing on the host and on the GPU, in turn;
#   write_out.txt    (asked for in CHECK_STEPS) bench_cuda.py --write-out: a batch's copy to the GPU alone;
#   spy_host.txt, spy_device.txt  (asked for in CHECK_STEPS) py-spy stacks of the collector
#                    storing on the host and on the GPU;
#   bench_heavy.txt  bench_central.py's heavy policy, forward pass on the GPU;
#   bench_nodes.txt  bench_node_scaling.py, 2 and 16 nodes on 16 cores (about 20 s a row there);
#   bench_inproc.txt (asked for in CHECK_STEPS) bench_collect.py --paired 40 on the three CPU
#                    workloads: issue 21's in-process ratios on a machine quieter than the 2-core VM;
# A step that fails is recorded and the next one still runs; the exit status is the tests'.
set -uo pipefail
OUT="${OUT:-/tmp/device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /tmp/install.txt 2>&1 || { cp /tmp/install.txt "$OUT/"; cat /tmp/install.txt; exit 3; }
if [[ -f .whl/ray-slim.tar.xz ]]; then  # WITH_RAY=1 fetch_wheels.sh: Ray for its GPU test
    tar xJf .whl/ray-slim.tar.xz -C /tmp/site || { echo "ray: unpacking failed"; exit 3; }
fi
export PYTHONPATH="/tmp/site:$PWD"

{
    nvidia-smi || true
    nproc
    python3 - <<'PY'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("nccl", torch.distributed.is_nccl_available() and torch.cuda.nccl.version())
for name in ("tensordict", "gymnasium", "torchrl", "anyio", "trio", "uvloop", "ray", "aiocollect"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "FAILED:", type(exc).__name__, exc)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# One deadline for the whole run (CHECK_BUDGET seconds, default 400), so that a session's
# 15 device minutes keep room for a second, fresh run: each step gets its own cap or what is
# left, whichever is less, in the order of what matters most.
BUDGET="${CHECK_BUDGET:-400}"
END=$(( $(date +%s) + BUDGET ))
cap() { local left=$(( END - $(date +%s) )); (( left < $1 )) && echo "$left" || echo "$1"; }
step() {  # step NAME CAP FILE CMD...: run CMD bounded, output to $OUT/FILE, with its exit and time
    local name=$1 limit; limit=$(cap "$2"); local file=$3; shift 3
    if (( limit < 10 )); then echo "$name: skipped, out of time" | tee "$OUT/$file"; return 0; fi
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" > "$OUT/$file" 2>&1
    local rc=$?
    echo "$name exit $rc after $(( SECONDS - t0 )) s (cap $limit s)" | tee -a "$OUT/$file" >> "$OUT/env.txt"
    tail -30 "$OUT/$file"
    return $rc
}

# CHECK_STEPS picks steps (default: all, in this order), e.g. CHECK_STEPS="tests bench_heavy"
# for a second run that redoes only what the first one left open.
STEPS=" ${CHECK_STEPS:-tests nccl_probe bench_cuda bench_paired bench_heavy bench_nodes} "  # also: spy_host spy_device write_out bench_inproc
want() { [[ "$STEPS" == *" $1 "* ]]; }
tests_rc=0

# The suite turns warnings into errors; the GPU image's torch is not the one the suite pins,
# so its deprecation notices are shown here instead of failing the tests.
if want tests; then
    step tests 200 cuda_tests.txt python3 -m pytest -p no:cacheprovider -q -rA -m cuda --timeout 120 \
        --durations 15 -W ignore::DeprecationWarning -W ignore::UserWarning -W ignore::FutureWarning \
        tests/test_cuda.py tests/test_async_batched.py tests/workers/test_lifecycle.py \
        tests/distributed/test_twins_and_cuda.py tests/distributed/test_ray.py  # Ray's: skipped without Ray
    tests_rc=$?
fi
want nccl_probe && step nccl_probe 45 nccl_probe.txt python3 tools/device/nccl_same_gpu.py
want bench_cuda && step bench_cuda 100 bench_cuda.txt python3 benchmarks/bench_cuda.py --repeats 2 \
    --json "$OUT/bench_cuda.json"
# The in-process rows again, one batch of each in turn: rows run one after the other can differ
# by the GPU's clocks alone.
want bench_paired && step bench_paired 45 bench_paired.txt python3 benchmarks/bench_cuda.py --paired 30
# A batch's write-out to the GPU alone, beside a strided copy_ and a plain DMA of the same bytes.
want write_out && step write_out 30 write_out.txt python3 benchmarks/bench_cuda.py --write-out --repeats 30
# Where each in-process side spends its time (py-spy, raw stacks per thread; the rollout runs on
# the thread named "aiocollect lane").
for side in host device; do
    want "spy_$side" && step "spy_$side" 40 "spy_$side.log" /tmp/site/bin/py-spy record --format raw --rate 200 \
        --threads --idle --nonblocking -o "$OUT/spy_$side.txt" -- python3 benchmarks/bench_cuda.py \
        --single "stored on the $side" --batches 60
done
# Central inference's heavy policy (issue 22) with the forward pass on the GPU, beside
# MultiSyncCollector with its policy on the CPU and on the GPU in each worker.
want bench_heavy && step bench_heavy 110 bench_heavy.txt python3 benchmarks/bench_central.py --workload heavy \
    --heavy-device cuda --repeats 1 --batches 4 --only "policy on" --only "MultiSyncCollector (2 workers)" \
    --only "2 torch threads"
# Distributed close with as many cores as nodes (issue 21): 2 against 16 nodes.
want bench_nodes && step bench_nodes 130 bench_nodes.txt python3 benchmarks/bench_node_scaling.py --nodes 2 16 \
    --inline --repeats 2
# The in-process paired ratios against the tight loop (CPU only; about 70 s on the 2-core VM).
want bench_inproc && step bench_inproc 120 bench_inproc.txt python3 benchmarks/bench_collect.py --paired 40 \
    --workload cartpole8 --workload cartpole1 --workload pendulum1
grep " exit " "$OUT/env.txt"
exit "$tests_rc"
