#!/usr/bin/env bash
# The folder the GPU check takes along (benchmarks/gpu/carry, at most 64 MiB): what the GPU
# machine's Python 3.12 lacks, as wheels for Python 3.12 on x86-64 Linux (check.sh unpacks
# them there: installing a wheel is unzipping it), and pmwd's source.
# Run it here, where the package registries are reachable, before the GPU machine starts.
set -euo pipefail
cd "$(dirname "$0")"
shared="${SHARED:-../../../shared}"
python="${PYTHON:-python3}"
[ ! -e carry ] || chmod -R u+w carry  # shared/ is read-only: what came from it too
rm -rf carry && mkdir -p carry/wheels carry/src
# healpy needs astropy (and it pyerfa, astropy-iers-data, pyyaml);
# pmwd needs mcfit; jz-tree is jztree with its CUDA 13 backend; the tests' compilation cache
# keeps to its size with filelock
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest carry/wheels \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any \
    "healpy==1.20.1" astropy pyerfa \
    astropy-iers-data pyyaml colossus filelock "jztree==1.1.0" "jztree-cu13==1.1.0"
# mcfit comes as source only: its package folder goes with pmwd's
"$python" -m pip download --quiet --no-deps --no-binary=:all: --dest carry/sdist "mcfit==0.0.22"
tar xzf carry/sdist/mcfit-*.tar.gz -C carry/src --strip-components=1 --wildcards "*/mcfit"
rm -rf carry/sdist
tar xzf "$shared"/third_party/pmwd-*.tar.gz -C carry/src --strip-components=1 pmwd/pmwd
chmod -R u+w carry  # shared/ is read-only; a second run removes this folder
du -sh carry
