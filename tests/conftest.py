"""Test set-up: 8 emulated CPU devices, set before JAX initialises."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# `distpm` commands the tests start keep no compilation cache (one test turns it on)
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
