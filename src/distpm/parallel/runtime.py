"""Many processes: start JAX's distributed runtime before JAX makes its backends.

Nothing here is home-made: :func:`initialize` calls
``jax.distributed.initialize``, which joins the processes through a
coordinator and lets XLA's collectives (gloo or MPI between CPU processes,
NCCL between GPUs) run across them. Where the settings come from, in order:

1. explicit values (CLI options ``--coordinator`` etc.);
2. the variables set by ``distpm launch``: ``DISTPM_COORDINATOR``,
   ``DISTPM_NUM_PROCESSES``, ``DISTPM_PROCESS_ID`` and optionally
   ``DISTPM_LOCAL_DEVICE_IDS`` (comma-separated GPU ids of this process),
   ``DISTPM_CLUSTER`` and ``DISTPM_CPU_COLLECTIVES`` (gloo or mpi);
3. JAX's own detection of the cluster: Slurm (``srun``: ``SLURM_JOB_ID``,
   ``SLURM_NTASKS`` ...) and Open MPI (``mpirun``: ``OMPI_MCA_orte_hnp_uri``
   ...); for other MPIs (MPICH, Open MPI 5) the mpi4py fallback, when
   mpi4py is installed and ``DISTPM_CLUSTER=mpi4py`` asks for it.

A single process (none of the above) needs no runtime at all.
"""

from __future__ import annotations

import dataclasses
import os

ENV_PREFIX = "DISTPM_"
CPU_COLLECTIVES = ("gloo", "mpi")


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """How this process joins the others.

    coordinator: "host:port" of process 0's coordinator service (None: detect).
    num_processes, process_id: None to detect. local_device_ids: the
    accelerators this process uses (None: all it sees).
    cluster: None (use JAX's automatic detection), or "slurm", "ompi",
    "mpi4py" to force one. cpu_collectives: "gloo" (default) or "mpi" (needs
    an MPI library that XLA can load, see docs/guides/processes.md).
    heartbeat_s: after this long without news from a process, the others
    stop with an error instead of waiting forever.
    """

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    cluster: str | None = None
    cpu_collectives: str = "gloo"
    heartbeat_s: int = 30
    init_timeout_s: int = 120

    def __post_init__(self):
        if self.cpu_collectives not in CPU_COLLECTIVES:
            raise ValueError(
                f"cpu_collectives must be one of {CPU_COLLECTIVES}, got {self.cpu_collectives!r}"
            )

    @property
    def explicit(self) -> bool:
        """True when the launch is described by settings, not left to detection."""
        return self.num_processes is not None or self.coordinator is not None


def settings_from_env(environ=None, **overrides) -> RuntimeSettings:
    """Settings from ``DISTPM_*`` variables, with explicit ``overrides`` (None = unset) on top."""
    env = os.environ if environ is None else environ

    def get(name, kind=str, what=None):
        value = env.get(ENV_PREFIX + name)
        if value is None or value == "":
            return None
        try:
            return kind(value)
        except ValueError:
            bad = f"{ENV_PREFIX}{name}={value!r}"
            raise ValueError(f"{bad} is not a valid {what or kind.__name__}") from None

    ids = get("LOCAL_DEVICE_IDS", _device_ids, "comma-separated list of device ids")
    values = {
        "coordinator": get("COORDINATOR"),
        "num_processes": get("NUM_PROCESSES", int),
        "process_id": get("PROCESS_ID", int),
        "local_device_ids": ids,
        "cluster": get("CLUSTER"),
        "cpu_collectives": get("CPU_COLLECTIVES") or "gloo",
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RuntimeSettings(**values)


def _device_ids(text: str) -> tuple[int, ...]:
    """Comma-separated device ids, e.g. "0,1"."""
    return tuple(int(i) for i in text.split(","))


def detected_cluster(environ=None) -> str | None:
    """Which launcher started this process: "slurm", "ompi" or None (checked like JAX does)."""
    env = os.environ if environ is None else environ
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    if all(v in env for v in slurm) and int(env["SLURM_NTASKS"]) > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env and int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "ompi"
    return None


def needed(settings: RuntimeSettings, environ=None) -> bool:
    """Whether this process is one of several (and so must start the runtime)."""
    if settings.explicit or settings.cluster is not None:
        return True
    return detected_cluster(environ) is not None


def initialize(settings: RuntimeSettings) -> None:
    """Join the other processes (``jax.distributed.initialize``); call before any JAX work."""
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "JAX was initialised before distpm's runtime: call "
            "distpm.parallel.runtime.initialize (or the CLI) before any JAX computation"
        )
    jax.config.update("jax_cpu_collectives_implementation", settings.cpu_collectives)
    if settings.cpu_collectives == "mpi":
        _make_cpu_backend_with_mpi()
    jax.distributed.initialize(
        coordinator_address=settings.coordinator,
        num_processes=settings.num_processes,
        process_id=settings.process_id,
        local_device_ids=list(settings.local_device_ids) if settings.local_device_ids else None,
        cluster_detection_method=settings.cluster,
        initialization_timeout=settings.init_timeout_s,
        heartbeat_timeout_seconds=settings.heartbeat_s,
    )


def _make_cpu_backend_with_mpi() -> None:
    """Make the CPU backend with MPI collectives that finalise MPI after Python's teardown.

    JAX's own CPU backend with ``jax_cpu_collectives_implementation = "mpi"``
    calls ``MPI_Finalize`` from a Python ``atexit`` handler, while XLA frees
    its MPI communicators only when the collectives object is destroyed, at
    the interpreter's teardown, after that handler: Open MPI then aborts both
    ranks ("MPI_Comm_free() was called after MPI_FINALIZE"), exit status 1,
    though the run was right. Here distpm makes the same backend itself
    (the same XLA collectives, the same client) and registers ``MPI_Finalize``
    of the MPI library that MPItrampoline loaded with the C runtime's exit
    handlers instead, which run after Python's teardown has freed the
    communicators.
    """
    import ctypes

    import jax

    try:  # JAX's own parts, not its public API: say so if a version moved them
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        make_collectives, make_client = _jax.make_mpi_collectives, xla_bridge.make_cpu_client
    except (ImportError, AttributeError) as error:
        raise RuntimeError(
            f"jax {jax.__version__} lacks the MPI collectives distpm knows ({error}); "
            "use --cpu-collectives gloo"
        ) from None
    library = os.environ.get("MPITRAMPOLINE_LIB")
    if not library:
        raise RuntimeError(
            "--cpu-collectives mpi needs MPITRAMPOLINE_LIB: the path of libmpiwrapper.so "
            "built against your MPI (MPIwrapper; see docs/guides/processes.md)"
        )
    try:
        finalize = ctypes.CDLL(library).MPIABI_Finalize  # the library the trampoline loads
    except (OSError, AttributeError) as error:
        raise RuntimeError(
            f"MPITRAMPOLINE_LIB={library!r} is not an MPIwrapper library: {error}"
        ) from None

    def cpu_client():
        collectives = make_collectives()
        collectives.Init()
        address = ctypes.cast(finalize, ctypes.c_void_p)
        # glibc's exit handlers (atexit is __cxa_atexit with no argument and no DSO)
        if ctypes.CDLL(None).__cxa_atexit(address, None, None) != 0:
            raise RuntimeError("could not register MPI_Finalize to run at exit")
        client = make_client(collectives=collectives)
        if len(client.local_devices()) > 1:  # XLA's MPI communicators serve one thread
            raise RuntimeError(
                f"--cpu-collectives mpi drives one device per process, but this process has "
                f"{len(client.local_devices())} (--cpu-devices or XLA_FLAGS' "
                "--xla_force_host_platform_device_count): start one process per device "
                "(e.g. mpirun -n 4 ... --devices 2x2), or use gloo"
            )
        return client

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


def is_main_process() -> bool:
    """True on process 0 (the one that logs and writes files)."""
    import jax

    return jax.process_index() == 0


def check_same_everywhere(text: str, what: str) -> None:
    """Raise on every process if ``text`` (e.g. a config) differs between processes."""
    import hashlib

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return
    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint32)
    first = multihost_utils.broadcast_one_to_all(digest)
    differs = multihost_utils.process_allgather(np.asarray(np.any(first != digest)))
    if np.any(differs):
        bad = [int(i) for i in np.flatnonzero(np.asarray(differs))]
        raise ValueError(f"processes {bad} have a different {what} from process 0")


def agree(flag: bool) -> bool:
    """Process 0's ``flag`` on every process (for decisions taken from a local clock)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag, np.int32)))


def to_host(x):
    """A numpy copy of a (possibly sharded) jax array on every process.

    With several processes the array is gathered from all of them: meant for
    outputs (spectra, image slabs, optionally saved fields), not the hot path.
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1 or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def barrier(name: str) -> None:
    """Wait until every process reaches this point (no-op with one process)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _block_number(index, length: int) -> int:
    """Which equal block along axis 0 a shard's index (a tuple of slices) covers."""
    start, stop = index[0].indices(length)[:2]
    return start // (stop - start)


def local_blocks(x) -> list[tuple[int, object]]:
    """(block index, numpy copy) of each block of ``x`` that this process holds.

    ``x`` is split along its first axis into equal blocks, one per device
    (sharding ``P(("x", "y"))``); blocks are numbered along that axis. No
    data moves between processes: this is how files are written per process.
    """
    import numpy as np

    out = {_block_number(s.index, x.shape[0]): np.asarray(s.data) for s in x.addressable_shards}
    return sorted(out.items())


def local_block_indices(shape, sharding) -> list[int]:
    """Indices of the blocks along axis 0 of an array of ``shape`` held by this process."""
    indices = sharding.addressable_devices_indices_map(tuple(shape)).values()
    return sorted({_block_number(index, shape[0]) for index in indices})


def from_local_blocks(blocks: dict, shape, sharding):
    """A global jax array of ``shape`` from this process's blocks along axis 0.

    blocks: {block index: numpy array} for every block of ``sharding`` held
    by this process's devices (the inverse of :func:`local_blocks`). No data
    moves between processes.
    """
    import jax

    return jax.make_array_from_callback(
        tuple(shape), sharding, lambda index: blocks[_block_number(index, shape[0])]
    )


def process_sum(value: int) -> int:
    """The sum of a Python int over all processes (exact past 2^31)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return int(value)
    words = np.array(divmod(int(value), 2**31), dtype=np.int32)  # stays exact in 32-bit jax
    both = np.asarray(multihost_utils.process_allgather(words)).astype(np.int64)
    return int(np.sum(both[:, 0]) * 2**31 + np.sum(both[:, 1]))


def process_max(values):
    """The elementwise maximum of an int32 numpy array over all processes."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return np.asarray(values)
    return np.max(np.asarray(multihost_utils.process_allgather(np.asarray(values))), axis=0)


def main_decides(check) -> None:
    """Run ``check()`` on process 0 alone (e.g. a look at a shared folder); if it raises a
    ValueError or an OSError, raise its message as a ValueError on every process."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    text = ""
    if is_main_process():
        try:
            check()
        except (ValueError, OSError) as err:
            text = str(err)
    if jax.process_count() > 1:
        words = np.zeros(4096, np.uint8)
        encoded = text.encode()[: words.size]
        words[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        words = np.asarray(multihost_utils.broadcast_one_to_all(words))
        text = bytes(words).rstrip(b"\0").decode(errors="replace")
    if text:
        raise ValueError(text)
