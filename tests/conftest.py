"""Test set-up: 8 emulated CPU devices, set before JAX initialises.

``DISTPM_TEST_PLATFORM`` (default ``cpu``) names the platform the tests run on,
e.g. ``cuda`` on a GPU machine. There, a test that needs more devices than the
machine has, or an optional package it lacks (:func:`optional_import`), skips
and says why; on the CPU, where 8 devices are emulated and every package is
installed, nothing skips: such a test fails instead. The one exception is a
source or tool no package registry serves (MPIwrapper, pmwd, MPI's compilers,
XLA's GPU compiler): outside CI a test that needs one the machine lacks skips
with its reason (:func:`not_here`); CI has them all and fails instead.
"""

import contextlib
import importlib
import os

# JAX's name "gpu" also asks for ROCm, which fails to start on an NVIDIA machine
PLATFORM = os.environ.get("DISTPM_TEST_PLATFORM", "cpu").replace("gpu", "cuda")
# 8 CPU devices: here, and in the CPU processes some tests start on any platform
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = PLATFORM
# Compiling is most of the suite's time on the CPU (tests/README.md, "Compiling once"), and
# most tests run tiny programs: they compile with JAX's jax_disable_most_optimizations (LLVM at
# -O0, no expensive passes): about a third less CPU to compile, programs that run slower (2 to
# 13 times). The modules whose runtime dominates compile fully optimized (the
# ``full_optimization`` marker, see _compiler_effort); so does every platform but the CPU
OPTIMIZE = "JAX_DISABLE_MOST_OPTIMIZATIONS"
if PLATFORM == "cpu":
    os.environ.setdefault(OPTIMIZE, "1")
# `distpm` commands the tests start keep no cache of their own (one test turns it on): they
# share the run's (JAX_COMPILATION_CACHE_DIR, see pytest_configure)
os.environ["DISTPM_COMPILE_CACHE"] = "off"

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from distpm.parallel.devices import TooFewDevices  # noqa: E402

# independent reference tables (colossus, CAMB), and make_tables.py that regenerates them
REFERENCE = Path(__file__).resolve().parent / "reference"
# sources no package registry serves (MPIwrapper, pmwd): where DISTPM_THIRD_PARTY says, or in
# shared/third_party beside the clone
THIRD_PARTY = Path(
    os.environ.get("DISTPM_THIRD_PARTY")
    or Path(__file__).resolve().parents[2] / "shared" / "third_party"
)
# the start of the reason of a skip for a tool or source this machine lacks (see not_here)
NOT_HERE = "not on this machine: "


def not_here(why: str):
    """The test needs a tool or source that no package registry serves and this machine
    lacks: in CI, which has them all, the test fails; elsewhere it skips, saying why."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(NOT_HERE + why)


def third_party(pattern: str) -> Path:
    """The archive in :data:`THIRD_PARTY` whose name matches ``pattern`` (see not_here)."""
    archive = next(THIRD_PARTY.glob(pattern), None)
    if archive is None:
        not_here(f"{pattern} not found in {THIRD_PARTY} (DISTPM_THIRD_PARTY names its folder)")
    return archive


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
    if report.skipped and NOT_HERE not in str(report.longrepr):
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """On the CPU nothing may skip but what :func:`not_here` skips: a run that skipped
    another test fails (say what to install)."""
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


# JAX's persistent compilation cache of the test runs: a folder of the clone (git ignores it),
# so that a fresh clone, as CI's, starts cold, and a second run here reads what the first compiled
XLA_CACHE = Path(__file__).resolve().parents[1] / ".xla-cache"


def pytest_configure(config):
    """One compilation cache for the test processes (pytest-xdist's workers) and the
    ``distpm`` processes the tests start: they reuse each other's compiled programs (those
    that took >= 1 s to compile) instead of compiling them again. At most 4 GB (the least
    recently used programs go first)."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(XLA_CACHE))  # processes inherit
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 10**9))  # these two
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"])
    )


# The longest files first (tests/README.md has their times, the slow tests included), so that
# pytest-xdist's two workers end together (``--dist loadfile`` hands out whole files in this
# order, as ``--no-loadscope-reorder`` in pyproject.toml keeps it from sorting by test count)
# rather than one of them starting a long file when the other is nearly done
LONGEST_FIRST = (
    "test_examples", "test_distributed", "test_neighbours", "test_limber", "test_halos",
    "test_lightcone", "test_processes", "test_api", "test_cli", "test_lightcone_gradients",
    "test_gpu_check", "test_gradients",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: files stay whole


@pytest.fixture(autouse=True, scope="module")
def _fresh_compilation_cache():
    """Drop each module's compiled executables when it ends (they hold memory
    mappings, see :func:`_few_memory_mappings`; and a module's compiler effort, see
    :func:`_compiler_effort`, is its own)."""
    yield
    jax.clear_caches()


@pytest.fixture(autouse=True, scope="module")
def _compiler_effort(request, _fresh_compilation_cache):
    """A module marked ``full_optimization`` compiles its programs, and those of the
    processes it starts, with every optimization of XLA (see :data:`OPTIMIZE`)."""
    if request.node.get_closest_marker("full_optimization") is None:
        yield
        return
    before = os.environ.get(OPTIMIZE)
    os.environ[OPTIMIZE] = "0"
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.clear_caches()  # before the next module compiles anything with less effort
    jax.config.update("jax_disable_most_optimizations", before == "1")
    if before is None:
        del os.environ[OPTIMIZE]
    else:
        os.environ[OPTIMIZE] = before


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
