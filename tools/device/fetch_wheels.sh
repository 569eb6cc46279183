#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before a GPU session's device run: downloads into .whl/ the
# wheels the GPU machine lacks (it has torch, numpy, anyio, pytest, psutil, uvloop... and
# no network). `.whl/` is git-ignored; the device tool carries it (carry: [".whl"]).
#
#   bash tools/device/fetch_wheels.sh
#
# The GPU image runs CPython 3.12 (see the device tool's KINDS.md); --no-deps, so every
# package its image lacks is named here. Pins: the versions the suite runs on here (pytest
# and its plugins too: the suite's --strict-config needs pytest-asyncio, which needs pytest
# 8.4+, and the image's versions are not known in advance).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rm -rf .whl && mkdir -p .whl
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl \
    tensordict==0.14.3 torchrl==0.14.1 gymnasium==1.4.0 farama-notifications==0.0.6 \
    pyvers hoptorch orjson importlib-metadata lazy-importer \
    trio outcome sniffio anyio==4.16.0 \
    pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-asyncio==1.5.0 pytest-timeout==2.4.0 \
    py-spy==0.4.3
# WITH_RAY=1: Ray too, for its GPU test (tests/distributed/test_ray.py, marked cuda). Its wheel
# (79 MB) is over what a device call carries (64 MiB), so it travels slimmed and packed: no
# Java jars, no RLlib/Data/Serve/Train/Tune/LLM, no dashboard web build (aiocollect's Ray tests
# pass without them: checked with the cp311 build of the same version), xz'd to about 20 MB;
# check.sh unpacks it into its site folder. Ray's own needs the image lacks: jsonschema's.
if [[ "${WITH_RAY:-0}" == 1 ]]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d .whl \
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$tmp" ray==2.60.0
    (cd "$tmp" && unzip -q ray-*.whl && rm ray-*.whl \
        && rm -rf ray/jars ray/rllib ray/data ray/serve ray/train ray/tune ray/llm ray/dashboard/client/build \
        && tar cf - ray ray-*.dist-info | xz -9 -T0 > ray-slim.tar.xz)  # unzip keeps the binaries' modes
    mv "$tmp/ray-slim.tar.xz" .whl/ && rm -rf "$tmp"
fi
du -sh .whl
ls .whl
