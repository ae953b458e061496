"""Test set-up: 8 emulated CPU devices, set before JAX initialises.

``DISTPM_TEST_PLATFORM`` (default ``cpu``) names the platform the tests run on,
e.g. ``cuda`` on a GPU machine. There, a test that needs more devices than the
machine has, or an optional package it lacks (:func:`optional_import`), skips
and says why; on the CPU, where 8 devices are emulated and every package is
installed, nothing skips: such a test fails instead.
"""

import contextlib
import importlib
import os
import shutil
import tempfile

# JAX's name "gpu" also asks for ROCm, which fails to start on an NVIDIA machine
PLATFORM = os.environ.get("DISTPM_TEST_PLATFORM", "cpu").replace("gpu", "cuda")
# 8 CPU devices: here, and in the CPU processes some tests start on any platform
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = PLATFORM
# `distpm` commands the tests start keep no cache of their own (one test turns it on): they
# share the run's (JAX_COMPILATION_CACHE_DIR, see pytest_configure)
os.environ["DISTPM_COMPILE_CACHE"] = "off"

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from distpm.parallel.devices import TooFewDevices  # noqa: E402

# the reference data beside the checkout (or where DISTPM_REFERENCE_DIR says: the GPU check)
REFERENCE = Path(
    os.environ.get("DISTPM_REFERENCE_DIR")
    or Path(__file__).resolve().parents[2] / "shared" / "reference"
)


def optional_import(name: str):
    """``import name``; on a platform other than the CPU, skip the test (or module) without it.

    For the packages that a GPU machine may lack and CPU CI installs: healpy,
    colossus, yt, pynbody."""
    if PLATFORM == "cpu":
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed on this {PLATFORM} machine")


@contextlib.contextmanager
def _skip_if_too_few_devices():
    """On a platform other than the CPU: a test that needs more devices than there are skips."""
    try:
        yield
    except TooFewDevices as err:
        if PLATFORM == "cpu":
            raise
        pytest.skip(f"{PLATFORM} has {jax.device_count()} devices: {err}")


_SKIPPED = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """On the CPU nothing may skip: a run that skipped a test fails (say what to install)."""
    if PLATFORM == "cpu" and _SKIPPED and exitstatus == pytest.ExitCode.OK:
        print(f"\n{len(_SKIPPED)} tests skipped on the CPU, where every test must run: {_SKIPPED}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    with _skip_if_too_few_devices():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with _skip_if_too_few_devices():
        return (yield)


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


# The longest files first (each 170-800 s of one worker in a run of 2026-11-29), so that
# pytest-xdist's two workers end together (``--dist loadfile`` hands out whole files in this
# order, as ``--no-loadscope-reorder`` in pyproject.toml keeps it from sorting by test count)
# rather than one of them starting a long file when the other is nearly done
LONGEST_FIRST = (
    "test_distributed", "test_neighbours", "test_lightcone", "test_halos", "test_processes",
    "test_api", "test_cli", "test_gpu_check", "test_gradients", "test_examples",
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
    """Drop each module's compiled executables when it ends (they hold memory
    mappings, see :func:`_few_memory_mappings`)."""
    yield
    jax.clear_caches()


# Linux's default limit of memory mappings per process (vm.max_map_count) is 65530
MAPPINGS = Path("/proc/self/maps")


@pytest.fixture(autouse=True)
def _few_memory_mappings():
    """Drop the compiled executables after a test once the process holds 40000 memory
    mappings. XLA's CPU compiler maps each object file of a program three times (code,
    constants, data), and a process keeps them while JAX caches the program: a long test
    module reached Linux's limit of 65530 mappings, and the next compile failed, which
    crashed the process (in the persistent cache's write of that program: its C++ exception
    crashed libgcc's unwinder). The next test recompiles what it needs, or reads it from the
    persistent cache."""
    yield
    if MAPPINGS.exists():
        with MAPPINGS.open() as maps:
            if sum(1 for _ in maps) > 40_000:
                jax.clear_caches()


@pytest.fixture(scope="session")
def healpix_response():
    """[sr] each pixel's share of a uniform sky under healpy's interpolation weights:
    healpix_response(nside, sub=8), by the midpoint rule on sub x sub points per pixel."""
    import numpy as np

    healpy = optional_import("healpy")

    def response(nside, sub=8):
        fine = nside * sub
        theta, phi = healpy.pix2ang(fine, np.arange(12 * fine**2))
        pix, w = healpy.get_interp_weights(nside, theta, phi)
        out = np.zeros(12 * nside**2)
        np.add.at(out, pix.ravel(), w.ravel())
        return out * 4 * np.pi / (12 * fine**2)

    return response
