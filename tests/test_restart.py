"""Checkpoint and restart: bitwise on the same layout, round-off on another, safe from SIGKILL."""

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

import distpm
from distpm import pipeline
from distpm.cli.main import main
from distpm.io import checkpoint, checksums
from distpm.parallel import devices
from distpm.runfile import OutputConfig, settings

COSMO = distpm.Cosmology.planck18()
CFG = distpm.SimConfig(
    mesh_shape=16, box_size=64.0, n_steps=6, parallel={"exchange_factor": 0.3, "devices": (2, 2)}
)
EXACT = OutputConfig(snapshot_double=True)  # float64 files: equality of files is of states


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run without checkpoints and the same run checkpointing every 2 steps."""
    root = tmp_path_factory.mktemp("restart")
    pipeline.run(CFG, COSMO, root / "plain", output=EXACT, progress=False)
    every = OutputConfig(snapshot_double=True, checkpoint_every=2)
    summary = pipeline.run(CFG, COSMO, root / "ckpt", output=every, progress=False)
    assert [c["step"] for c in summary["checkpoints"]] == [2, 4]
    return root


def _final(out, number=0):
    """Positions, velocities (file units, float64) and ids of a run's snapshot ``number`` (the
    final one when there are no others), by id."""
    with h5py.File(out / f"snapdir_{number:03d}" / f"snapshot_{number:03d}.0.hdf5") as f:
        group = f["PartType1"]
        ids = group["ParticleIDs"][:]
        order = np.argsort(ids)
        return group["Coordinates"][:][order], group["Velocities"][:][order], ids[order]


def _resumable_copy(runs, name):
    out = runs / name
    shutil.copytree(runs / "ckpt" / "checkpoints", out / "checkpoints")
    return out


def test_checkpoints_keep_the_two_newest_with_checksums_and_do_not_change_the_run(runs):
    root = runs / "ckpt" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00002", "step_00004"]
    assert sorted(p.name for p in (root / "step_00004").iterdir()) == ["COMPLETE", "rank_0.h5"]
    record = json.loads((root / "step_00004" / "COMPLETE").read_text())
    assert record["sha256"] == {"rank_0.h5": checksums.sha256(root / "step_00004" / "rank_0.h5")}
    assert record["step"] == 4 and record["a"] == pytest.approx(0.7)
    assert record["momenta_kicked_ahead"] is True  # between outputs: as the run holds them
    assert record["device_grid"] == [2, 2] and record["processes"] == 1
    assert record["deterministic"] is False and record["platform"] == "cpu"
    for a, b in zip(_final(runs / "plain"), _final(runs / "ckpt"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_resume_on_the_same_grid_is_bitwise(runs):
    out = _resumable_copy(runs, "same")
    summary = pipeline.run(CFG, COSMO, out, output=EXACT, resume=out, progress=False)
    assert summary["resumed_from_step"] == 4 and len(summary["timings"]["steps_s"]) == 2
    for a, b in zip(_final(runs / "plain"), _final(out), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("grid", [(1, 1), (4, 2)])
def test_resume_on_another_grid_agrees_to_round_off(runs, grid):
    out = _resumable_copy(runs, f"grid{grid[0]}x{grid[1]}")
    cfg = CFG.on(grid, capacity_factor=2.0)  # layout options may change
    pipeline.run(cfg, COSMO, out, output=EXACT, resume=out, progress=False)
    (x0, v0, i0), (x1, v1, i1) = _final(runs / "plain"), _final(out)
    np.testing.assert_array_equal(i0, i1)
    box = 64000.0  # kpc/h
    dx = np.abs(x1 - x0)
    dx = np.minimum(dx, box - dx)  # periodic
    assert dx.max() / box < 1e-5
    assert np.abs(v1 - v0).max() / np.abs(v0).max() < 1e-5


def test_a_change_of_physics_is_refused_in_one_line(runs, capsys):
    changed = "made with cosmology.sigma8=0.8102 but the config has cosmology.sigma8=0.9;"
    with pytest.raises(ValueError, match=changed):
        checkpoint.read_checkpoint(runs / "ckpt", COSMO.replace(sigma8=0.9), CFG)
    args = ["run", "--resume", str(runs / "ckpt"), "--out", str(runs / "refused")]
    assert main([*args, "--set", "n_steps=7", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "made with n_steps=6 but the config has n_steps=7" in err, err


def _flip(path, dataset, n=64):
    """Invert n bytes in the middle of ``dataset`` (contiguous) of the HDF5 file."""
    with h5py.File(path) as f:
        start, size = f[dataset].id.get_offset(), f[dataset].id.get_storage_size()
    at = start + max(0, size // 2 - n // 2)
    with open(path, "r+b") as f:
        f.seek(at)
        data = f.read(min(n, size))
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("damage", [*checkpoint.FIELDS, "truncated"])
def test_a_damaged_checkpoint_is_refused_in_one_line(runs, damage, capsys):
    out = _resumable_copy(runs, f"damaged_{damage}")
    rank_file = out / "checkpoints" / "step_00004" / "rank_0.h5"
    if damage == "truncated":
        os.truncate(rank_file, rank_file.stat().st_size - 1000)
    else:
        _flip(rank_file, damage)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "step_00004/rank_0.h5 does not match the SHA-256 in its COMPLETE record" in err, err
    assert "--fallback" in err and not (out / "snapdir_000").exists()


def test_the_fallback_resumes_from_the_newest_checkpoint_that_verifies(runs, capsys):
    """A damaged newest checkpoint is set aside; the run goes on from the one before it, as the
    uninterrupted run (bitwise), and may write its checkpoints on another schedule."""
    out = _resumable_copy(runs, "fallback")
    _flip(out / "checkpoints" / "step_00004" / "rank_0.h5", "pos")
    args = ["run", "--resume", str(out), "--fallback", "--no-progress"]
    assert main([*args, "--set", "output.checkpoint_every=3"]) == 0
    err = capsys.readouterr().err
    assert "step_00004/rank_0.h5 does not match" in err and "moved to damaged_step_00004" in err
    assert f"resuming from {out / 'checkpoints' / 'step_00002'}" in err
    for a, b in zip(_final(runs / "plain"), _final(out), strict=True):
        np.testing.assert_array_equal(a, b)
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["damaged_step_00004", "step_00002", "step_00003"], kept
    assert main(["run", "--fallback", "--no-progress", "--out", str(out / "x")]) == 2
    assert "--fallback chooses the checkpoint to --resume from" in capsys.readouterr().err


def test_a_resume_that_changes_outputs_or_halos_is_refused_with_the_keys(runs, capsys):
    out = _resumable_copy(runs, "changed_outputs")
    args = ["run", "--resume", str(out), "--no-progress", "--set", "output.multipoles=true"]
    assert main([*args, "--set", "halos.min_members=30"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "made with halos.min_members=20 but the config has halos.min_members=30" in err, err
    assert "(and 1 more: output.multipoles)" in err, err


def test_a_checkpoint_written_before_the_parallel_table_resumes(runs):
    """Checkpoints of earlier versions stored the parallel options at the config's top level:
    their settings still make the run's config (its [parallel] table)."""
    out = _resumable_copy(runs, "flat")
    marker = out / "checkpoints" / "step_00004" / "COMPLETE"
    record = json.loads(marker.read_text())
    record["config"] |= record["config"].pop("parallel")
    marker.write_text(json.dumps(record))
    cfg, *_ = settings(checkpoint.stored_settings(out))
    assert cfg == CFG and cfg.parallel.devices == (2, 2)


def test_a_missing_rank_file_is_one_clear_error(runs, capsys):
    out = _resumable_copy(runs, "missing")
    marker = out / "checkpoints" / "step_00004" / "COMPLETE"
    marker.write_text(marker.read_text().replace('"processes": 1', '"processes": 2'))
    assert main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step_00004 lacks rank_1.h5" in err, err


def test_resume_from_a_checkpoint_at_an_output_kicks_the_particles_first(tmp_path):
    """At an output time the stored momenta are synchronised, so the resumed run kicks them
    before its next step, as the uninterrupted run did; a record written before the kicks
    were merged (no momenta_kicked_ahead, always synchronised) is read the same way."""
    cfg = CFG.replace(snapshots=(float(CFG.time_grid[4]),))
    pipeline.run(cfg, COSMO, tmp_path / "plain", output=EXACT, progress=False)
    every = OutputConfig(snapshot_double=True, checkpoint_every=4)
    pipeline.run(cfg, COSMO, tmp_path / "ckpt", output=every, progress=False)
    record = json.loads((tmp_path / "ckpt" / "checkpoints" / "step_00004" / "COMPLETE").read_text())
    assert record["step"] == 4 and record["momenta_kicked_ahead"] is False
    older = {k: v for k, v in record.items() if k != "momenta_kicked_ahead"}
    for name, stored in (("same", record), ("older", older)):
        out = tmp_path / name
        shutil.copytree(tmp_path / "ckpt" / "checkpoints", out / "checkpoints")
        (out / "checkpoints" / "step_00004" / "COMPLETE").write_text(json.dumps(stored))
        pipeline.run(cfg, COSMO, out, output=EXACT, resume=out, progress=False)
        for a, b in zip(_final(tmp_path / "plain", 1), _final(out, 1), strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_2lpt_integrator_resumes_bitwise_between_outputs(tmp_path):
    """Between its steps the 2LPT integrator's positions lie half a step behind; a checkpoint
    there holds them so, and the resumed run ends bitwise as the uninterrupted one."""
    cfg = CFG.replace(integrator="2lpt")
    pipeline.run(cfg, COSMO, tmp_path / "plain", output=EXACT, progress=False)
    every = OutputConfig(snapshot_double=True, checkpoint_every=2)
    pipeline.run(cfg, COSMO, tmp_path / "ckpt", output=every, progress=False)
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "ckpt" / "checkpoints", out / "checkpoints")
    summary = pipeline.run(cfg, COSMO, out, output=EXACT, resume=out, progress=False)
    assert summary["resumed_from_step"] == 4
    for a, b in zip(_final(tmp_path / "plain"), _final(out), strict=True):
        np.testing.assert_array_equal(a, b)


def test_wall_time_checkpoints(tmp_path):
    output = OutputConfig(snapshot_format="none", checkpoint_minutes=1e-9, keep_checkpoints=1)
    summary = pipeline.run(CFG, COSMO, tmp_path, output=output, progress=False)
    assert [c["step"] for c in summary["checkpoints"]] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00005"]


def _cli(args, cwd, **options):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    command = [sys.executable, "-m", "distpm.cli.main", *args]
    return subprocess.Popen(command, cwd=cwd, env={**env, "JAX_PLATFORMS": "cpu"}, **options)


def test_sigkill_during_a_checkpoint_write_leaves_one_that_resumes(tmp_path):
    args = ["run", "--set", "mesh_shape=32", "--set", "n_steps=12", "--no-progress"]
    args += ["--set", "output.snapshot_double=true"]
    plain = _cli([*args, "--out", "plain"], tmp_path)
    assert plain.wait(timeout=600) == 0
    out = tmp_path / "killed"
    killed = _cli([*args, "--set", "output.checkpoint_every=1", "--out", str(out)], tmp_path)
    root, caught = out / "checkpoints", None
    try:
        while killed.poll() is None and caught is None:
            partial = list(root.glob(".step_*.partial")) if root.is_dir() else []
            if partial and list(root.glob("step_*/COMPLETE")):
                killed.send_signal(signal.SIGSTOP)  # freeze it mid-write, then check
                if partial[0].exists():
                    caught = partial[0].name
                    killed.send_signal(signal.SIGKILL)
                else:
                    killed.send_signal(signal.SIGCONT)
            time.sleep(0.0002)
    finally:
        killed.kill()
        killed.wait()
    assert caught, "the run ended before a checkpoint write could be interrupted"
    assert (root / caught).exists()  # the interrupted write is still there, unfinished
    resumed = _cli(["run", "--resume", str(out), "--no-progress"], tmp_path)
    assert resumed.wait(timeout=600) == 0
    for a, b in zip(_final(tmp_path / "plain"), _final(out), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_resume_on_a_gpu_warns_unless_both_runs_are_deterministic(monkeypatch, recwarn):
    """The CPU adds in a fixed order; a GPU's scatter-adds do only in deterministic mode, and
    two platforms never add alike."""
    warn = checkpoint._warn_if_not_bitwise
    warn({"platform": "cpu", "deterministic": False}, "here")
    assert not recwarn.list
    monkeypatch.setattr(checkpoint.jax, "default_backend", lambda: "cuda")
    monkeypatch.setenv("XLA_FLAGS", " ".join(devices.DETERMINISTIC_FLAGS))
    warn({"platform": "cuda", "deterministic": True}, "here")
    assert not recwarn.list
    for record in ({"platform": "cuda", "deterministic": False}, {"platform": "cuda"}):
        with pytest.warns(UserWarning, match="round-off, not bitwise"):
            warn(record, "here")
    with pytest.warns(UserWarning, match="made on cpu"):  # another platform: never bitwise
        warn({"platform": "cpu", "deterministic": True}, "here")
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.warns(UserWarning, match="--deterministic"):
        warn({"platform": "cuda", "deterministic": True}, "here")


def test_deterministic_mode_sets_the_flags_once_and_only_before_jax_starts(monkeypatch):
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert not devices.is_deterministic(environ)
    devices.set_deterministic(environ)
    devices.set_deterministic(environ)  # idempotent: each flag once
    flags = environ["XLA_FLAGS"].split()
    assert flags[0] == "--xla_force_host_platform_device_count=2" and len(flags) == 3
    assert devices.is_deterministic(environ)
    asked = {"1": True, "on": True, "0": False, "": False, "no": False}
    for value, want in asked.items():
        assert devices.deterministic_asked({devices.DETERMINISTIC_ENV: value}) is want
    with pytest.raises(ValueError, match="DISTPM_DETERMINISTIC='maybe'"):
        devices.deterministic_asked({devices.DETERMINISTIC_ENV: "maybe"})
    distpm.white_noise(0, CFG).block_until_ready()  # JAX's backends are up: too late
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(RuntimeError, match="before JAX starts"):
        devices.set_deterministic()
    assert os.environ["XLA_FLAGS"] == ""
