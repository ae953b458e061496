"""Many processes on one machine: JAX's distributed runtime with gloo, through `distpm launch`."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from conftest import not_here, optional_import, third_party

import distpm
from distpm.cli import launch
from distpm.io import folder
from distpm.state import linear_ids

RUN = ["--set", "mesh_shape=32", "--set", "box_size=128.0", "--set", "n_steps=5"]


def _environment(extra=None):
    """This environment on the CPU, without the tests' XLA_FLAGS (each run sets its own)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", **(extra or {})}


def _mpirun(n):
    """The mpirun command line for n local processes (Debian's Open MPI, see .ci/run)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun not found: install Open MPI (apt-get install openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        mpirun,
        *root,
        "--oversubscribe",
        "-n",
        str(n),
        "-x",
        "XLA_FLAGS",
        "-x",
        "JAX_PLATFORMS",
    ]


def _run(command, cwd, timeout=600, launcher=(), env_extra=None):
    """Run ``python command`` (under ``launcher`` if given) and capture its output."""
    return subprocess.run(
        [*launcher, sys.executable, *command],
        cwd=cwd,
        env=_environment(env_extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _distpm(*args, cwd, **options):
    return _run(["-m", "distpm.cli.main", *args], cwd, **options)


def _two_mpi_processes(code, cwd, env_extra=None, mpirun_options=()):
    """``python -c code`` as 2 Open MPI processes with 2 CPU devices each."""
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    launcher = [*_mpirun(2), *mpirun_options]
    result = _run(["-c", code], cwd, 300, launcher, {**flags, **(env_extra or {})})
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def mpiwrapper(tmp_path_factory):
    """``libmpiwrapper.so`` built against Debian's Open MPI: the MPI library that XLA's MPI
    collectives load through MPItrampoline (``MPITRAMPOLINE_LIB``), as
    docs/guides/processes.md says."""
    archive = third_party("MPIwrapper-*.tar.gz")
    missing = [tool for tool in ("cmake", "mpicc", "gfortran") if shutil.which(tool) is None]
    if missing:
        not_here(f"{missing} not found: apt-get install cmake libopenmpi-dev gfortran")
    root = tmp_path_factory.mktemp("mpiwrapper")
    shutil.unpack_archive(archive, root)
    build = root / "build"
    for command in (
        ["cmake", "-S", root / "MPIwrapper", "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", build, "-j", "2"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    return build / "libmpiwrapper.so"


def test_two_processes_match_one_process_and_one_device(tmp_path, mpiwrapper):
    runs = {
        "2 processes x 2 devices": [
            "launch", "-n", "2", "--cpu-devices-per-process", "2", "--",
            "run", *RUN, "--devices", "2x2",
        ],
        "1 process x 4 devices": ["run", *RUN, "--cpu-devices", "4", "--devices", "2x2"],
        "1 device": ["run", *RUN, "--devices", "1x1"],
        "mpirun 2 processes": ["run", *RUN, "--devices", "2x2"],
        # XLA's MPI collectives drive one device per process
        "mpirun 2 processes, MPI": ["run", *RUN, "--devices", "2x1", "--cpu-collectives", "mpi"],
    }  # fmt: skip
    fields = {}
    for name, args in runs.items():
        out = tmp_path / name.replace(" ", "_")
        options = {}
        if name.startswith("mpirun"):  # found by JAX's Open MPI detection, nothing else set
            mpi = name.endswith("MPI")
            flags = f"--xla_force_host_platform_device_count={1 if mpi else 2}"
            env = {"XLA_FLAGS": flags, "MPITRAMPOLINE_LIB": str(mpiwrapper)} if mpi else {}
            launcher = [*_mpirun(2), "-x", "MPITRAMPOLINE_LIB"] if mpi else _mpirun(2)
            options = {"launcher": launcher, "env_extra": {"XLA_FLAGS": flags, **env}}
        args = [*args, "--save-fields", "--no-progress", "--out", str(out)]
        args += ["--set", "output.checkpoint_every=3"]
        result = _distpm(*args, cwd=tmp_path, **options)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("done in") == 1, result.stdout  # process 0 alone reports
        fields[name] = np.load(out / "density.npy"), np.load(out / "white_noise.npy")
        summary = json.loads((out / "summary.json").read_text())
        assert summary["processes"] == (1 if name.startswith("1") else 2)
        grid = {"1 device": [1, 1], "mpirun 2 processes, MPI": [2, 1]}.get(name, [2, 2])
        assert summary["device_grid"] == grid and len(summary["devices"]) == grid[0] * grid[1]
        memory = summary["memory_per_device"]["step_memory_per_device"]
        assert memory["total_bytes"] > memory["temp_bytes"] > 0
        assert memory["alias_bytes"] > 0  # step_in_place: the state's buffers are reused
        assert sorted(p.name for p in out.iterdir()) == sorted(summary["outputs"])
    delta, noise = fields["2 processes x 2 devices"]
    for name in [n for n in runs if n != "2 processes x 2 devices"]:
        np.testing.assert_array_equal(noise, fields[name][1])
        ref = fields[name][0]
        assert np.max(np.abs(delta - ref)) / np.max(np.abs(ref)) < 1e-5, name
    _readers_agree(tmp_path / "2_processes_x_2_devices", tmp_path / "1_device")
    # the 2-process run's checkpoint (after step 3 of 5) resumes in 1 process on 1 device
    resumed = tmp_path / "resumed"
    args = ["run", "--resume", str(tmp_path / "2_processes_x_2_devices"), "--devices", "1x1"]
    result = _distpm(*args, "--save-fields", "--no-progress", "--out", str(resumed), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed after step 3" in result.stdout
    ref = fields["1 device"][0]
    assert np.max(np.abs(np.load(resumed / "density.npy") - ref)) / np.max(np.abs(ref)) < 1e-5
    # a byte changed in rank_1.h5, which process 1 hashes: both processes refuse the resume
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "2_processes_x_2_devices" / "checkpoints", damaged / "checkpoints")
    rank_1 = damaged / "checkpoints" / "step_00003" / "rank_1.h5"
    data = bytearray(rank_1.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rank_1.write_bytes(bytes(data))
    args = ["launch", "-n", "2", "--cpu-devices-per-process", "2", "--", "run", "--resume"]
    result = _distpm(*args, str(damaged), "--devices", "2x2", "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    both = result.stdout + result.stderr  # launch relays what each process prints
    assert both.count("step_00003/rank_1.h5 does not match the SHA-256") == 2, both


def _readers_agree(two, one):
    """yt and pynbody read the 2-process snapshot (2 files) as the 1-device run's (1 file)."""
    pynbody = optional_import("pynbody")
    yt = optional_import("yt")

    snaps = {out: out / "snapdir_000" / "snapshot_000" for out in (two, one)}
    assert sorted(p.name for p in snaps[two].parent.iterdir()) == [
        "snapshot_000.0.hdf5",
        "snapshot_000.1.hdf5",
    ]
    counts = []
    for rank in (0, 1):  # each process wrote its own particles; the headers know the total
        with h5py.File(f"{snaps[two]}.{rank}.hdf5") as f:
            header = f["Header"].attrs
            assert header["NumPart_Total"][1] == 32**3 and header["NumFilesPerSnapshot"] == 2
            counts.append(int(header["NumPart_ThisFile"][1]))
            assert f["PartType1/ParticleIDs"].shape == (counts[-1],)
    assert sum(counts) == 32**3 and min(counts) > 0
    read = {}
    for out, base in snaps.items():
        data = yt.load(f"{base}.0.hdf5").all_data()
        order = np.argsort(data["PartType1", "particle_index"].d)
        x = data["PartType1", "particle_position"].to("Mpccm/h").d[order]
        v = data["PartType1", "particle_velocity"].to("km/s").d[order]
        sim = pynbody.load(str(base))
        by_id = np.argsort(sim["iord"])
        np.testing.assert_allclose(sim["pos"].in_units("Mpc a h**-1")[by_id], x, atol=1e-4)
        np.testing.assert_allclose(sim["vel"].in_units("km s**-1")[by_id], v, atol=1e-3)
        read[out] = x, v
    (x2, v2), (x1, v1) = read[two], read[one]
    assert len(x2) == len(x1) == 32**3
    dx = np.abs(x2 - x1)
    assert np.max(np.minimum(dx, 128.0 - dx)) < 1e-3  # Mpc/h: the runs agree to round-off
    assert np.max(np.abs(v2 - v1)) < 1e-3 * np.max(np.abs(v1))


def test_two_processes_refuse_a_used_folder_and_a_folder_in_use(tmp_path):
    """Process 0 looks at the folder and holds its lock; both processes refuse in one line."""
    args = ["launch", "-n", "2", "--cpu-devices-per-process", "1", "--", "run"]
    args += ["--set", "mesh_shape=8", "--set", "box_size=32.0", "--devices", "2x1"]
    args += ["--no-progress"]
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.json").write_text("{}\n")  # another run's
    result = _distpm(*args, "--out", str(used), cwd=tmp_path)
    both = result.stdout + result.stderr  # launch relays what each process prints
    assert result.returncode == 2, both
    assert both.count(f"{used} holds another run's outputs (summary.json)") == 2, both
    assert "Traceback" not in both, both
    assert sorted(p.name for p in used.iterdir()) == ["summary.json"]
    assert (used / "summary.json").read_text() == "{}\n"
    busy = tmp_path / "busy"
    other = folder.Claim(busy)  # a run writing there (flock: as from another process)
    try:
        result = _distpm(*args, "--out", str(busy), cwd=tmp_path)
        both = result.stdout + result.stderr
        assert result.returncode == 2, both
        assert both.count(f"another distpm run is writing into {busy} (pid {os.getpid()}") == 2
    finally:
        other.release(complete=False)
    assert sorted(p.name for p in busy.iterdir()) == [folder.INCOMPLETE]  # nothing written


def test_launch_stops_everything_when_a_process_dies(tmp_path):
    args = ["launch", "-n", "2", "--cpu-devices-per-process", "2", "--", "run"]
    args += ["--set", "mesh_shape=32", "--set", "n_steps=2000", "--devices", "2x2"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "distpm.cli.main", *args, "--out", str(tmp_path / "o")],
        cwd=tmp_path,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in launcher.stdout:  # wait until the steps run
            if "PM steps" in line or "[0]" in line and "step" in line:
                break
        workers = subprocess.run(
            ["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(workers) == 2, workers
        start = time.monotonic()
        os.kill(int(workers[1]), signal.SIGKILL)
        status = launcher.wait(timeout=120)
        assert status != 0
        assert time.monotonic() - start < 120
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _peers(tmp_path, args_of, **popen_options):
    """Two `distpm run` processes joined by explicit settings, without a launcher.

    ``args_of(rank)`` gives each process's run options; stderr is piped.
    """
    port = str(launch.free_port())
    procs = []
    for rank in range(2):
        joined = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
        joined += ["--process-id", str(rank)]
        command = [sys.executable, "-m", "distpm.cli.main", "run", *args_of(rank), *joined]
        procs.append(
            subprocess.Popen(
                command,
                cwd=tmp_path,
                env=_environment(),
                stderr=subprocess.PIPE,
                text=True,
                **popen_options,
            )
        )
    return procs


def test_processes_with_different_configs_stop_with_an_error(tmp_path):
    """Explicit settings (--coordinator ...) join two processes; their seeds differ."""
    procs = _peers(
        tmp_path,
        lambda rank: [
            "--set",
            "mesh_shape=16",
            "--set",
            f"seed={rank}",
            "--out",
            "o",
            "--cpu-devices",
            "1",
        ],
    )
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2, err
        assert "processes [1] have a different config from process 0" in err


def test_a_grid_that_leaves_a_process_without_devices_is_an_error(tmp_path):
    args = ["--set", "mesh_shape=16", "--out", "o", "--cpu-devices", "2", "--devices", "2x1"]
    for p in _peers(tmp_path, lambda rank: args):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2, err
        assert "processes [1] would have none" in err, err


def test_a_survivor_stops_by_itself_when_its_peer_is_killed(tmp_path):
    """Without a launcher to clean up, JAX's heartbeat ends the surviving process."""
    args = ["--set", "mesh_shape=32", "--set", "n_steps=2000", "--out", "o"]
    args += ["--cpu-devices", "2", "--devices", "2x2"]
    procs = _peers(tmp_path, lambda rank: args, stdout=subprocess.DEVNULL)
    try:
        for line in procs[0].stderr:  # process 0's progress bar: the steps run
            if "PM steps" in line:
                break
        procs[1].kill()
        start = time.monotonic()
        status = procs[0].wait(timeout=120)
        assert status != 0 and time.monotonic() - start < 120
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_mpi4py_fallback_finds_the_processes(tmp_path):
    """DISTPM_CLUSTER=mpi4py: JAX asks MPI (through mpi4py) for rank, size and coordinator."""
    code = (
        "from distpm.parallel import runtime; runtime.initialize(runtime.settings_from_env()); "
        "import jax; i = jax.process_index(); "
        "open(f'joined-{i}.txt', 'w').write(f'{i} {jax.process_count()} {jax.device_count()}')"
    )  # one file per process: mpirun may interleave the processes' stdout mid-line
    env = {"DISTPM_CLUSTER": "mpi4py"}
    result = _two_mpi_processes(code, tmp_path, env, mpirun_options=["-x", "DISTPM_CLUSTER"])
    joined = sorted(f.read_text() for f in tmp_path.glob("joined-*.txt"))
    assert joined == ["0 2 4", "1 2 4"], result.stdout + result.stderr


def test_by_id_gathers_from_every_process(tmp_path):
    """Particles.by_id on 2 processes x 2 devices: every process gets all N particles."""
    code = (
        "from distpm.parallel import runtime; runtime.initialize(runtime.settings_from_env()); "
        "import jax, numpy as np, distpm; "
        "cfg = distpm.SimConfig(mesh_shape=8, box_size=32.0, parallel='2x2'); "
        "noise, cosmo = distpm.white_noise(3, cfg), distpm.Cosmology.planck18(); "
        "state = distpm.initial_conditions(noise, cosmo, cfg); "
        "np.save(f'ids-{jax.process_index()}.npy', state.by_id('ids')); "
        "np.save(f'pos-{jax.process_index()}.npy', state.by_id('pos'))"
    )  # fmt: skip
    _two_mpi_processes(code, tmp_path)
    cfg = distpm.SimConfig(mesh_shape=8, box_size=32.0, parallel="1x1")
    ref = distpm.initial_conditions(distpm.white_noise(3, cfg), distpm.Cosmology.planck18(), cfg)
    for rank in (0, 1):
        ids = linear_ids(np.load(tmp_path / f"ids-{rank}.npy"), cfg.particle_shape)
        np.testing.assert_array_equal(ids, np.arange(8**3))
        pos = np.load(tmp_path / f"pos-{rank}.npy")
        assert np.max(np.abs(pos - ref.by_id("pos"))) < 1e-4


def test_fof_and_catalogue_on_two_processes_equal_one_process(tmp_path):
    """FoF labels (bitwise) and the halo catalogue of 2 processes x 2 devices = 1 process;
    so are their Gadget-4 snapshot and catalogue files, as h5py, yt and pynbody read them."""
    cfg = distpm.SimConfig(
        mesh_shape=32, box_size=64.0, n_steps=10, a_start=0.1, parallel={"exchange_factor": 0.3}
    )
    cosmo = distpm.Cosmology.planck18()
    run = distpm.simulate(distpm.white_noise(0, cfg), cosmo, cfg)
    labels = distpm.fof(run, cfg)
    want = distpm.halo_catalogue(run, labels, cosmo, cfg)
    search = 2 * np.cbrt(3 * want.n / (4 * np.pi * 200 * cfg.n_particles / 64.0**3))
    np.savez(
        tmp_path / "run.npz", pos=run.by_id("pos"), vel=run.by_id("vel"), ids=run.by_id("ids"),
        centres=want.pos, search=search,
    )  # fmt: skip
    code = (
        "from distpm.parallel import runtime; runtime.initialize(runtime.settings_from_env()); "
        "import dataclasses, jax, numpy as np, distpm; from distpm.shares import from_rows; "
        "cfg = distpm.SimConfig(mesh_shape=32, box_size=64.0, n_steps=10, a_start=0.1, "
        "parallel={'exchange_factor': 0.3, 'devices': '2x2'}); "
        "d = np.load('run.npz'); "
        "rows = lambda a, b: {k: d[k][a:b] for k in ('pos', 'vel', 'ids')}; "
        "p = from_rows(rows, len(d['ids']), cfg.a_stop, cfg); "
        "labels = distpm.fof(p, cfg); "
        "cosmo = distpm.Cosmology.planck18(); "
        "cat = distpm.halo_catalogue(p, labels, cosmo, cfg); "
        "distpm.io.write_groups('two', p, labels, cat, cosmo, cfg); "
        "so = distpm.spherical_overdensity(p, d['centres'], d['search'], cosmo, cfg); "
        "h = runtime.to_host; m = h(p.mask); "
        "np.savez(f'out-{jax.process_index()}.npz', ids=h(p.ids)[m], labels=h(labels)[m], "
        "N200m=so['N200m'], N200c=so['N200c'], "
        "**{k: v for k, v in dataclasses.asdict(cat).items() if k != 'a'})"
    )  # fmt: skip
    _two_mpi_processes(code, tmp_path)
    so = distpm.spherical_overdensity(run, want.pos, search, cosmo, cfg)
    distpm.io.write_groups(tmp_path / "one", run, labels, want, cosmo, cfg)
    _group_files_agree(tmp_path / "two", tmp_path / "one")
    mask = np.asarray(run.mask)
    ids = linear_ids(np.asarray(run.ids)[mask], cfg.particle_shape)
    by_id = dict(zip(ids, map(tuple, np.asarray(labels)[mask]), strict=True))
    assert len(want) > 50
    for rank in (0, 1):
        out = np.load(tmp_path / f"out-{rank}.npz")
        ids = linear_ids(out["ids"], cfg.particle_shape)
        assert len(ids) == cfg.n_particles
        assert all(by_id[i] == tuple(lab) for i, lab in zip(ids, out["labels"], strict=True))
        np.testing.assert_array_equal(out["label"], want.label)
        np.testing.assert_array_equal(out["n"], want.n)
        for field in ("pos", "vel", "sigma_v", "r_rms", "lagrangian_pos"):
            scale = np.abs(getattr(want, field)).max()
            np.testing.assert_allclose(out[field], getattr(want, field), atol=1e-5 * scale)
        # spherical overdensity around the same centres: the same counts on 2 processes
        for name in ("N200m", "N200c"):
            np.testing.assert_array_equal(out[name], so[name])
        assert np.count_nonzero(so["N200m"]) > 40


def _group_files_agree(two, one):
    """The 2-process snapshot and catalogue files (2 of each) hold what the 1-process
    files hold, in the same order; yt and pynbody find the same members in both."""
    pynbody = optional_import("pynbody")
    yt = optional_import("yt")

    def read(out, stem, name):
        files = sorted(out.glob(f"{stem}.*.hdf5"))
        assert len(files) == (2 if out == two else 1)
        parts = []
        for path in files:
            with h5py.File(path) as f:
                parts.append(f[name][()])
        return np.concatenate(parts)

    snapshot, groups = "snapdir_000/snapshot_000", "groups_000/fof_subhalo_tab_000"
    for stem, name in (
        [(snapshot, f"PartType1/{k}") for k in ("ParticleIDs", "Coordinates")]
        + [(groups, f"Group/{k}") for k in ("GroupLen", "GroupOffsetType", "DistpmLabel")]
        + [(groups, "IDs/ID")]
    ):
        assert np.array_equal(read(two, stem, name), read(one, stem, name)), name
    length = read(one, groups, "Group/GroupLen")
    ids = read(one, groups, "IDs/ID")
    bounds = np.cumsum(length)
    units = {"UnitLength_in_cm": 3.0856775814913673e21, "UnitVelocity_in_cm_per_s": 1e5}
    ds = yt.load(str(two / f"{groups}.0.hdf5"), unit_base=units)
    sim = pynbody.load(str(two / snapshot))
    halos = sim.halos(filename=str(two / groups))
    assert len(halos) == len(length) > 50
    for i in range(len(length)):
        members = ids[bounds[i] - length[i] : bounds[i]]
        assert np.array_equal(halos[i]["iord"], members)
        assert np.array_equal(ds.halo("Group", i)["Group", "member_ids"].d, members)


def test_lightcone_maps_on_two_processes_equal_one_device(tmp_path, x64):
    """Each process records its own particles' crossings; the summed maps equal 1 device's."""
    setup = (
        "distpm.SimConfig(box_size=400.0, mesh_shape=16, a_start=0.4, n_steps=6, "
        "dtype='float64', parallel={{'exchange_factor': 0.3, 'devices': '{}'}})"
    )
    lc = "LightconeConfig(source_redshifts=(0.3, 0.6), nside=8, flat_fov=20.0, flat_pixels=16)"
    code = (
        "from distpm.parallel import runtime; runtime.initialize(runtime.settings_from_env()); "
        "import jax; jax.config.update('jax_enable_x64', True); "
        "import numpy as np, distpm; "
        "from distpm.lightcone import LightconeConfig, lightcone; "
        f"cfg = {setup.format('2x2')}; "
        f"maps, _ = lightcone(distpm.white_noise(4, cfg), distpm.Cosmology.planck18(), cfg, {lc}); "
        "np.savez(f'maps-{jax.process_index()}.npz', **{k: np.asarray(v) for k, v in maps.items()})"
    )  # fmt: skip
    _two_mpi_processes(code, tmp_path)
    from distpm.lightcone import LightconeConfig, lightcone  # noqa: F401 (used by eval)

    cfg = eval(setup.format("1x1"))
    ref, _ = lightcone(distpm.white_noise(4, cfg), distpm.Cosmology.planck18(), cfg, eval(lc))
    for rank in (0, 1):
        got = np.load(tmp_path / f"maps-{rank}.npz")
        assert sorted(got) == sorted(ref)
        for kind, m in ref.items():
            m = np.asarray(m)
            np.testing.assert_allclose(got[kind], m, atol=1e-5 * np.std(m), rtol=0)
