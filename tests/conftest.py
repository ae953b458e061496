"""Test set-up: 8 emulated CPU devices, set before JAX initialises."""

import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# `distpm` commands the tests start keep no cache of their own (one test turns it on): they
# share the run's (JAX_COMPILATION_CACHE_DIR, see pytest_configure)
os.environ["DISTPM_COMPILE_CACHE"] = "off"

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"


@pytest.fixture
def x64():
    """Run a test in float64 (jax's x64 mode on for its duration only)."""
    with jax.enable_x64(True):
        yield


def pytest_configure(config):
    """One compilation cache for the whole run: the test processes (pytest-xdist's
    workers) and the ``distpm`` processes the tests start reuse each other's
    compiled programs (those that took >= 1 s to compile) instead of compiling
    them again. A new, empty directory per run, removed at its end."""
    if not hasattr(config, "workerinput"):  # the run's first process: make it
        directory = tempfile.mkdtemp(prefix="distpm-tests-xla-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = directory  # workers inherit it
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])


# The longest files first (each 280-760 s of one worker in a run of 2026-11-26), so that
# pytest-xdist's two workers end together (``--dist loadfile`` hands out whole files in this
# order, as ``--no-loadscope-reorder`` in pyproject.toml keeps it from sorting by test count)
# rather than one of them starting a long file when the other is nearly done
LONGEST_FIRST = (
    "test_distributed", "test_halos", "test_limber", "test_api", "test_lightcone",
    "test_processes", "test_neighbours",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: files stay whole


@pytest.fixture(scope="session")
def reference_dir():
    if not REFERENCE.is_dir():
        pytest.fail(f"reference data not found at {REFERENCE} (clone the repo next to shared/)")
    return REFERENCE


@pytest.fixture(autouse=True, scope="module")
def _fresh_compilation_cache():
    """Drop each module's compiled executables when it ends (a long session of
    compiles crashed XLA's CPU compiler once in CI)."""
    yield
    jax.clear_caches()


@pytest.fixture(scope="session")
def healpix_response():
    """[sr] each pixel's share of a uniform sky under healpy's interpolation weights:
    healpix_response(nside, sub=8), by the midpoint rule on sub x sub points per pixel."""
    import healpy
    import numpy as np

    def response(nside, sub=8):
        fine = nside * sub
        theta, phi = healpy.pix2ang(fine, np.arange(12 * fine**2))
        pix, w = healpy.get_interp_weights(nside, theta, phi)
        out = np.zeros(12 * nside**2)
        np.add.at(out, pix.ravel(), w.ravel())
        return out * 4 * np.pi / (12 * fine**2)

    return response
