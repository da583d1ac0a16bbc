#!/usr/bin/env bash
# The wheels tdiag needs on a lent GPU machine (torch 2.11 + CUDA 13 on Python 3.12, no internet),
# downloaded here into .whl/ (ignored by git) for the device tool to carry (`carry: [".whl"]`).
#
# Exactly the packages of pyproject.toml's dependencies that those machines lack. Their image holds
# torch, numpy, networkx, sympy, opt-einsum, matplotlib, tqdm, pytest and hypothesis
# (the device tool's list of installed packages, read 2026-11-17); it lacks lark (the .td parser) and graphviz
# (the Python binding; rendering only, but a dependency of the package). Both are pure Python, at
# the versions tdiag is tested with here. Run from anywhere: scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS=(lark==1.3.1 graphviz==0.21)

mkdir -p .whl
for wheel in "${WHEELS[@]}"; do
  rm -f ".whl/${wheel%%==*}-"*.whl  # one version of each: two stop the install there
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${WHEELS[@]}"
ls -l .whl
