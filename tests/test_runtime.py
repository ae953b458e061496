"""The multi-process runtime's settings, read from the environment (Slurm, Open MPI,
``DISTPM_*``) and given to the processes ``distpm launch`` starts; no process is started
here (tests/test_processes.py starts them)."""

import io

import pytest

from distpm.cli import launch
from distpm.parallel import runtime

SLURM = {
    "SLURM_JOB_ID": "123",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}
OPEN_MPI = {
    "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:4242",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
}


@pytest.mark.parametrize(("environ", "cluster"), [(SLURM, "slurm"), (OPEN_MPI, "ompi"), ({}, None)])
def test_launchers_are_detected_from_their_environment(environ, cluster):
    assert runtime.detected_cluster(environ) == cluster
    assert runtime.needed(runtime.settings_from_env(environ), environ) == (cluster is not None)


def test_jax_reads_the_slurm_and_open_mpi_variables(monkeypatch):
    """JAX's detection (which `initialize` relies on) gives the process count and id."""
    from jax._src.clusters import OmpiCluster, SlurmCluster

    for cls, environ in ((SlurmCluster, SLURM), (OmpiCluster, OPEN_MPI)):
        for key, value in environ.items():
            monkeypatch.setenv(key, value)
        assert cls.is_env_present()
        assert cls.get_process_count() == 2 and cls.get_process_id() == 1
    assert SlurmCluster.get_coordinator_address(None, None).startswith("node01:")
    assert OmpiCluster.get_coordinator_address(None, None).startswith("10.0.0.1:")


def test_settings_from_distpm_variables():
    env = {
        "DISTPM_COORDINATOR": "127.0.0.1:1234",
        "DISTPM_NUM_PROCESSES": "4",
        "DISTPM_PROCESS_ID": "3",
        "DISTPM_LOCAL_DEVICE_IDS": "0,1",
    }
    settings = runtime.settings_from_env(env, process_id=2)
    assert settings.coordinator == "127.0.0.1:1234" and settings.num_processes == 4
    assert settings.process_id == 2 and settings.local_device_ids == (0, 1)
    assert settings.cpu_collectives == "gloo"
    with pytest.raises(ValueError, match="DISTPM_NUM_PROCESSES='two'"):
        runtime.settings_from_env({"DISTPM_NUM_PROCESSES": "two"})
    with pytest.raises(ValueError, match="DISTPM_LOCAL_DEVICE_IDS='0;1' is not a valid comma"):
        runtime.settings_from_env({"DISTPM_LOCAL_DEVICE_IDS": "0;1"})
    with pytest.raises(ValueError, match="cpu_collectives"):
        runtime.RuntimeSettings(cpu_collectives="nccl")


def test_launch_gives_each_process_its_own_devices(monkeypatch):
    """The environment of each launched process (what JAX reads when it starts)."""
    monkeypatch.delenv("DISTPM_LOCAL_DEVICE_IDS", raising=False)
    gpu = [launch.worker_environment(r, 2, 1234, None, gpus=2) for r in range(2)]
    assert [e["DISTPM_LOCAL_DEVICE_IDS"] for e in gpu] == ["0,1", "2,3"]
    assert [e["DISTPM_PROCESS_ID"] for e in gpu] == ["0", "1"]
    settings = runtime.settings_from_env(gpu[1])
    assert settings.local_device_ids == (2, 3) and settings.coordinator == "127.0.0.1:1234"
    cpu = launch.worker_environment(1, 2, 1234, 3)
    assert "device_count=3" in cpu["XLA_FLAGS"] and cpu["JAX_PLATFORMS"] == "cpu"
    assert "DISTPM_LOCAL_DEVICE_IDS" not in cpu
    with pytest.raises(ValueError, match="not both"):
        launch.launch(2, ["run"], cpu_devices=2, gpus=1)
    with pytest.raises(ValueError, match="--gpus-per-process must be positive"):
        launch.launch(2, ["run"], gpus=0)


def test_launch_forwards_lines_with_their_carriage_returns():
    """Progress bars redraw in place (\r kept); undecodable bytes do not stop the output."""
    out = io.StringIO()
    launch._forward(io.BytesIO(b"\rbar 1\rbar 2\n\xffdone\n"), 3, out)
    assert out.getvalue() == "[3] \r[3] bar 1\r[3] bar 2\n[3] \ufffddone\n"


def test_runtime_after_jax_started_is_a_clear_error():
    import jax

    jax.devices()  # this test process has started JAX already
    settings = runtime.RuntimeSettings(coordinator="127.0.0.1:1", num_processes=2, process_id=0)
    with pytest.raises(RuntimeError, match="JAX was initialised before distpm's runtime"):
        runtime.initialize(settings)


def test_distpm_asks_for_xlas_low_memory_cpu_schedule_unless_told_otherwise():
    """``import distpm`` puts the memory-minimising CPU schedule in ``XLA_FLAGS`` before JAX
    starts (this process has it), keeps the other flags, and leaves a choice made in
    ``XLA_FLAGS`` as it is."""
    import os

    from distpm.parallel import devices

    flag = devices.CPU_SCHEDULER_FLAG
    assert f"{flag}=false" in os.environ["XLA_FLAGS"].split()
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert devices.prefer_low_memory_cpu_schedule(environ)
    assert environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=4",
        f"{flag}=false",
    ]
    chosen = {"XLA_FLAGS": f"{flag}=true"}
    assert not devices.prefer_low_memory_cpu_schedule(chosen)
    assert chosen["XLA_FLAGS"] == f"{flag}=true"
