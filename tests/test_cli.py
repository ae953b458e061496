"""The command line: a small run writes every output; bad input gives one error line."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from distpm.cli.main import main


def _cli(*args, cwd):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_writes_every_output(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(
        "box_size = 128.0\nmesh_shape = 16\nn_steps = 4\na_stop = 0.7\nsnapshots = [0.5]\n"
        '[cosmology]\npreset = "planck18"\nsigma8 = 0.8\n'
        "[output]\npower_every = 2\nmultipoles = true\n"
    )
    out = tmp_path / "out"
    result = _cli(
        "run", str(config), "--out", str(out), "--set", "seed=3", "--no-progress",
        "--deterministic", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr  # no warning the user cannot act on
    for name in (
        "power.txt",
        "power.png",
        "density.png",
        "summary.json",
        "power_a0.5000.txt",
        "power_a0.5000.png",
        "density_a0.5000.png",
        "power_steps.png",
        "multipoles.png",
        "multipoles_a0.5000.png",
    ):
        assert (out / name).stat().st_size > 0, name
    for number, a in ((0, 0.5), (1, 0.7)):  # a Gadget-4 snapshot at each output
        with h5py.File(out / f"snapdir_00{number}" / f"snapshot_00{number}.0.hdf5") as f:
            assert f["Header"].attrs["Time"] == pytest.approx(a, rel=1e-12)
            assert f["PartType1/ParticleIDs"].shape == (16**3,)
    table = np.loadtxt(out / "power.txt")
    assert table.shape[1] == 5 and np.all(table[:, 1] > 0) and np.all(table[:, 2] > 0)
    import distpm
    from distpm import Cosmology, halofit  # the halofit column: that of the run's a and sigma8

    cosmo = Cosmology.planck18().replace(sigma8=0.8)
    want = np.asarray(halofit.nonlinear_power(table[:, 0], cosmo, float(f"{0.7:.7g}")))
    np.testing.assert_allclose(table[:, 4], want, rtol=1e-4)
    assert table[-1, 4] > 1.05 * table[-1, 3]  # above linear at the largest k
    # redshift-space multipoles of the same bins, next to Kaiser's of the linear and halofit P
    poles = np.loadtxt(out / "multipoles.txt")
    np.testing.assert_allclose(poles[:, [0, 4]], table[:, [0, 2]], rtol=1e-6)
    f = float(distpm.growth_rate(0.7, cosmo))
    np.testing.assert_allclose(poles[:, 5], (1 + 2 * f / 3 + f * f / 5) * table[:, 3], rtol=1e-4)
    np.testing.assert_allclose(poles[:, 9], (4 * f / 3 + 4 * f * f / 7) * table[:, 4], rtol=1e-4)
    # P(k) inside the steps: at steps 2 and 4 of the 5 (a = 0.4, 0.55) and at the end
    rows = np.loadtxt(out / "power_steps.txt")
    np.testing.assert_allclose(rows[:, 0], [0.4, 0.55, 0.7], rtol=1e-6)
    np.testing.assert_allclose(rows[-1, 1:], table[:, 1], rtol=1e-5)
    growth = np.asarray(distpm.growth_factor(rows[:, 0], cosmo) / distpm.growth_factor(0.7, cosmo))
    # the largest scale grows as linear theory says, up to its few modes' coupling (1.1% here)
    np.testing.assert_allclose(rows[:, 1] / rows[-1, 1], growth**2, rtol=0.02)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["seed"] == 3 and summary["config"]["mesh_shape"] == [16, 16, 16]
    assert summary["cosmology"]["sigma8"] == pytest.approx(0.8)
    # XLA's CPU backend takes the GPU determinism flags (and adds in a fixed order anyway)
    assert summary["deterministic"] is True and summary["platform"] == "cpu"
    # 4 equal steps from 0.1 to 0.7 with the snapshot a=0.5 inserted: 5 steps;
    # a_stop = 0.7 is not exact in float32, and its outputs are still power.txt etc.
    assert len(summary["timings"]["steps_s"]) == 5


def test_default_commands_print_no_warning(tmp_path):
    """``distpm info``, ``plan``, ``ics`` and a default ``run`` (64^3, progress bar on) write
    nothing to stderr but the run's progress bar: no warning the user cannot act on."""
    for args in (["info"], ["plan"], ["ics", "--out", "ics"], ["run", "--out", "run"]):
        result = _cli(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stderr.splitlines() if line and "PM steps:" not in line]
        assert lines == [], (args, lines)
    assert np.loadtxt(tmp_path / "run" / "power.txt").shape[1] == 5


def test_a_missing_optional_package_is_one_line_before_the_run(monkeypatch, capsys, tmp_path):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "camb" else find(n))
    args = ["run", "--set", 'linear_power="camb"', "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == 'distpm: error: linear_power = "camb" needs the camb package: pip install camb'
    assert not (tmp_path / "o").exists()


def test_plan_out_writes_the_plan(tmp_path, capsys):
    args = ["plan", "--set", "mesh_shape=16", "--devices", "2x2", "--out", str(tmp_path)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "plan.txt").read_text() == printed
    numbers = json.loads((tmp_path / "plan.json").read_text())
    assert numbers["peak_bytes"] == max(m["total_bytes"] for m in numbers["programs"].values())
    assert all(f"\n{name} " in printed for name in numbers["programs"]), printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--set", "box_size=-5"], "box_size must be positive"),
        (["run", "--set", 'box_size="256"'], 'box_size must hold numbers (256, not "256")'),
        (["run", "--set", 'cosmology.sigma8="0.8"'], "cosmology parameters must be numbers"),
        (["run", "--set", f"seed={2**63}"], "seed must be an integer in [0, 2^63)"),
        (["run", "--set", "box_size=[64.0, 64.0, 128.0]"], "box_size (64.0, 64.0, 128.0) must be"),
        (["run", "--set", "n_stepz=5"], "unknown option"),
        (["run", "--set", "cosmology.Omega_x=1"], "unknown cosmology parameter"),
        (["run", "missing.toml"], "does not exist"),
        (["run", "--set", "a_start=2", "--set", "a_stop=1"], "a_start < a_stop"),
        (["run", "--devices", "3x1"], "mesh_shape[0] = 64 is not divisible by 3"),
        (["run", "--devices", "two"], "devices must look like '2x2'"),
        (["run", "--set", "snapshot_format=none"], "belong in the [output] table"),
        (["run", "--set", "output.snapshot_format=hdf"], "snapshot_format must be one of"),
        (["run", "--set", "output.checkpoint_every=-1"], "checkpoint_every must be an integer"),
        (["run", "--set", "output.power_every=1.5"], "power_every must be an integer"),
        (["run", "--set", "output.line_of_sight=w"], 'line_of_sight must be "x", "y" or "z"'),
        (["run", "--resume", "nowhere"], "no complete checkpoint in nowhere"),
        (["run", "--ics", "nowhere"], "snapshot file nowhere.hdf5 does not exist"),
        (["run", "--set", "halos.min_member=5"], "unknown halos option(s) ['min_member']"),
        (["run", "--set", "halos=3"], "halos must be true, false or a table"),
        (["run", "--set", "halos.linking_length=0"], "linking_length must be > 0"),
        (["run", "--set", "halos.min_members=1"], "halos.group_factor >= 1 (it is 0.05)"),
        (["plan", "--device-memory", "lots"], "device memory must look like 80GB"),
        (["run", "--set", "lightcone.nsid=8"], "unknown lightcone option(s) ['nsid']"),
        (["run", "--set", "lightcone.nside=12"], "nside must be a power of 2"),
        (
            ["run", "--set", "lightcone.nside=8", "--set", "lightcone.source_redshifts=[20.0]"],
            "start the run earlier",
        ),
    ],
)
def test_bad_input_is_one_error_line(args, message, capsys, tmp_path):
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distpm: error:") and message in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_info_lists_devices(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend: cpu" in out and "process 0 of 1" in out
    assert "cpu:0" in out


def test_plan_says_whether_a_run_fits(capsys):
    args = ["plan", "--set", "mesh_shape=16", "--devices", "2x2", "--device-memory"]
    assert main([*args, "100kB"]) == 1
    out = capsys.readouterr().out
    assert "16^3 particles on a 2x2 grid (cpu)" in out and "does NOT fit" in out
    assert main([*args, "1GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("needs ") and lines[-1].endswith("fits (0%)")
    step = next(line for line in lines if line.startswith("step")).split()
    assert step[2] == "KiB" and float(step[1]) > 100 and int(step[3]) > 50  # bytes/particle


def test_a_run_that_does_not_fit_is_refused_before_it_starts(tmp_path, capsys):
    """`distpm run --device-memory` plans first and stops with the plan's lines, having
    written nothing. Without the option it plans against what the device reports (a GPU's
    allocator limit); a CPU reports nothing, and nothing is planned."""
    import distpm
    from distpm import plan

    out = tmp_path / "out"
    args = ["run", "--set", "mesh_shape=16", "--devices", "2x2", "--out", str(out)]
    assert main([*args, "--device-memory", "100kB"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "initial_conditions" in err and "does NOT fit" in err
    assert not out.exists() or not any(out.iterdir())
    cfg = distpm.SimConfig(mesh_shape=16, box_size=64.0, n_steps=2, parallel=(2, 2))
    assert plan.check_fits(distpm.Cosmology.planck18(), cfg) is None


def test_a_run_whose_halo_finder_does_not_fit_is_refused_before_it_starts(tmp_path, capsys):
    """With ``[halos]`` on, FoF and the catalogue are planned with the run's programs: a device
    that holds the simulation but not the halo finder refuses the run before it starts,
    naming the program that does not fit."""
    out = tmp_path / "out"
    args = ["run", "--set", "mesh_shape=16", "--devices", "2x2", "--out", str(out)]
    assert main([*args, "--set", "halos=true", "--device-memory", "400kB"]) == 2
    err = capsys.readouterr().err
    sizes = {}
    for line in err.splitlines():
        words = line.split()
        if len(words) > 2 and words[2] in ("KiB", "MiB"):
            sizes[words[0]] = float(words[1]) * {"KiB": 2**10, "MiB": 2**20}[words[2]]
    assert {"initial_conditions", "step", "kick", "fof", "catalogue"} <= set(sizes), err
    simulation = max(sizes[name] for name in ("initial_conditions", "step", "kick"))
    assert simulation < 400e3 < sizes["fof"], sizes  # the halo finder alone does not fit
    assert "does NOT fit" in err and not (out.exists() and any(out.iterdir()))


@pytest.mark.parametrize(("integrator", "first"), [("fastpm", "kick"), ("2lpt", "drift")])
def test_plan_figures_are_those_of_the_run(integrator, first):
    """The programs planned from shapes alone need what the run's compiled programs need;
    FastPM's step with an observer (P(k) every step) as the run compiles it. The run holds
    no more than the plan counts: its white noise is gone once the particles are made, and
    an output's programs count all of its particles."""
    import jax

    import distpm
    from distpm import pipeline, plan
    from distpm.analysis.power_steps import PowerSteps

    cosmo = distpm.Cosmology.planck18()
    cfg = distpm.SimConfig(
        mesh_shape=16,
        box_size=64.0,
        n_steps=2,
        integrator=integrator,
        parallel={"devices": (2, 2), "exchange_factor": 0.3},
    )
    observers = [PowerSteps(cfg, 1)]  # in the step, and in the 2LPT integrator's closing drift
    planned = plan.memory_plan(cosmo, cfg, gradient=True, observers=observers)["programs"]
    info = {}
    steps = pipeline.evolve_with_progress(
        cosmo, cfg, progress=False, info=info, observers=observers
    )
    noise_like = lambda: sum(  # noqa: E731
        x.shape == cfg.particle_shape and x.dtype == cfg.float_dtype for x in jax.live_arrays()
    )
    held = noise_like()
    _, state, _, _ = next(steps)  # the initial conditions
    per_device = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state))
    next(steps)  # the first step (compiled; it reuses the particles' buffers)
    assert noise_like() == held  # the run does not keep its white noise through the steps
    # an output's programs count all of the particles the run holds, read or not
    assert planned["output_density"]["argument_bytes"] == per_device
    assert planned["output_power"]["argument_bytes"] == per_device + 8 * 8 * 16 * 4  # + delta
    for name in ("step", first):
        ran = info[f"{name}_memory_per_device"]
        for key in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes"):
            assert planned[name][key] == ran[key], (name, key)
    ran = info["step_memory_per_device"]
    assert planned["step"]["bytes_per_particle"] == ran["total_bytes"] / (16**3 / 4)
    assert planned["gradient"]["total_bytes"] > planned["step"]["total_bytes"]


def test_initial_conditions_and_step_stay_within_a_kicks_memory_on_8_devices():
    """XLA's memory per device of the compiled programs at 64^3 on 4x2. The step holds what
    the kick holds, to 1% (19% more while the scaled momenta were a copy), and the
    initial conditions at most 1.35x (1.61x while their FFTs ran side by side)."""
    import distpm
    from distpm import plan

    cfg = distpm.SimConfig(mesh_shape=64, box_size=256.0, parallel=(4, 2))
    programs = plan.compile_programs(distpm.Cosmology.planck18(), cfg)
    total = {name: plan.memory_per_device(c)["total_bytes"] for name, (c, _) in programs.items()}
    assert total["step"] <= 1.01 * total["kick"], total
    assert total["initial_conditions"] <= 1.35 * total["kick"], total


def test_a_gpu_plan_counts_the_fft_work_area_and_the_allocators_limit(monkeypatch):
    """On a GPU, cuFFT's work area (one complex field of the pencil: 8 x 8 x 9 complex64 on a
    2x2 grid of a 16^3 mesh) is added to each program, and a run that does not fit is told
    how to raise JAX's 75% limit."""
    import distpm
    from distpm import plan

    cfg = distpm.SimConfig(mesh_shape=16, box_size=64.0, n_steps=2, parallel=(2, 2))
    compiled = plan.compile_programs(distpm.Cosmology.planck18(), cfg)
    on_cpu = {n: plan.program_memory(c, s, cfg) for n, (c, s) in compiled.items()}
    monkeypatch.setattr(plan.jax, "default_backend", lambda: "cuda")
    on_gpu = {n: plan.program_memory(c, s, cfg) for n, (c, s) in compiled.items()}
    for name, memory in on_gpu.items():
        assert on_cpu[name]["fft_workspace_bytes"] == 0
        assert memory["fft_workspace_bytes"] == 8 * 8 * 9 * 8
        assert memory["total_bytes"] == on_cpu[name]["total_bytes"] + 8 * 8 * 9 * 8
    result = {"programs": on_gpu, "peak_bytes": 10**6, "particles_per_device": 1024,
              "backend": "cuda"}  # fmt: skip
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in plan.describe(result, cfg, 10**5)[-1]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in " ".join(plan.describe(result, cfg, 10**7))


def test_a_repeated_run_compiles_nothing(tmp_path):
    """With --compile-cache, the second identical run finds every program in the cache."""
    cache = tmp_path / "cache"
    args = ["run", "--set", "mesh_shape=16", "--set", "n_steps=2", "--devices", "2x2"]
    args += ["--no-progress", "--compile-cache", str(cache)]
    entries = []
    for name in ("first", "second"):
        result = _cli(*args, "--out", str(tmp_path / name), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        entries.append(sorted(p.name for p in cache.iterdir()))
    assert len(entries[0]) > 5 and entries[1] == entries[0]
    power = [np.loadtxt(tmp_path / name / "power.txt") for name in ("first", "second")]
    np.testing.assert_array_equal(*power)
