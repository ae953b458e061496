#!/usr/bin/env bash
# The GPU check (issue 37) on a machine with one NVIDIA GPU, from the source tree, unattended:
#
#   bash benchmarks/gpu/prepare.sh                    # here, before: the folder to take along
#   bash benchmarks/gpu/check.sh                      # there: results in $OUT (or below)
#   bash benchmarks/gpu/check.sh --smoke              # every step, tiny, on the CPU
#
# PYTHON: the Python with jax (default python3). Options go to check.py (--budget, --out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results/gpu_check}"
exec "${PYTHON:-python3}" benchmarks/gpu/check.py --out "$out" "$@"
