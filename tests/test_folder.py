"""A run's output folder: another run's outputs are refused unless replaced, a live run's
folder is locked, and a folder says when its outputs are incomplete (issue 63)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import not_here

import distpm
from distpm.cli.main import INTERRUPTED, main
from distpm.io import folder, write_snapshot

RUN = ["run", "--set", "mesh_shape=8", "--set", "n_steps=2", "--set", "box_size=32.0"]
RUN += ["--devices", "1x1", "--no-progress"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_another_runs_outputs_are_refused_unless_overwritten(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*RUN, "--set", "seed=1", "--out", str(out)]) == 0
    assert not (out / folder.INCOMPLETE).exists() and not (out / folder.LOCK).exists()
    before = (out / "summary.json").read_text()
    (out / "halos.txt").write_text("# a file of the first run that the second does not write\n")
    assert main([*RUN, "--set", "seed=2", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"{out} holds another run's outputs (density.png, halos.txt, power.png" in err, err
    assert "give --overwrite to replace them, or --resume" in err, err
    # a linear spectrum the second run reads, kept in the folder under a name like an output's
    table = out / "power_linear.txt"
    k = np.logspace(-4, 2, 300)
    np.savetxt(table, np.column_stack([k, distpm.linear_power(k, distpm.Cosmology.planck18())]))
    second = [*RUN, "--set", "seed=2", "--set", f'linear_power="{table}"', "--out", str(out)]
    assert main(second) == 2
    err = _one_line(capsys)
    assert "outputs (density.png, halos.txt, power.png, power.txt and 2 more)" in err, err
    assert (out / "summary.json").read_text() == before  # nothing written
    assert main([*second, "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["seed"] == 2
    assert not (out / "halos.txt").exists()  # the first run's outputs went with it
    assert table.exists()  # not the run's input
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*json.loads((out / "summary.json").read_text())["outputs"], table.name]
    )


def test_a_folder_in_use_is_refused_and_a_failed_run_says_it_is_incomplete(tmp_path, capsys):
    out = tmp_path / "busy"
    other = folder.Claim(out)  # a run writing there (flock: as from another process)
    assert (out / folder.INCOMPLETE).exists()
    assert main([*RUN, "--out", str(out)]) == 2
    assert f"another distpm run is writing into {out} (pid " in _one_line(capsys)
    other.release(complete=False)  # it failed: the marker stays, and only the marker
    assert main([*RUN, "--ics", str(tmp_path / "absent"), "--out", str(out)]) == 2
    assert "absent.hdf5 does not exist" in _one_line(capsys)
    assert (out / folder.INCOMPLETE).exists()
    assert main([*RUN, "--out", str(out)]) == 0  # nothing of value there: reused
    assert not (out / folder.INCOMPLETE).exists()


def test_an_empty_out_is_refused(capsys):
    assert main([*RUN, "--out", ""]) == 2
    assert "--out is empty" in _one_line(capsys)


def test_ctrl_c_is_one_line_and_leaves_the_folder_marked_incomplete(tmp_path):
    """Ctrl-C in the steps: one line, exit status 130, the folder marked incomplete, and
    at once even while the main thread waits for the devices (it does not run Python then:
    the program leaves from a thread woken by the signal)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONFAULTHANDLER="1")  # SIGABRT: where it hangs
    args = ["run", "--set", "mesh_shape=16", "--set", "n_steps=100000", "--no-progress"]
    command = [sys.executable, "-m", "distpm.cli.main", *args, "--out", "o"]
    # a pytest-xdist worker may ignore SIGINT, and so would its children (distpm, as Python,
    # then keeps ignoring it): the run gets the default back, as from a shell
    default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    run = subprocess.Popen(
        command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=default
    )
    try:
        deadline = time.time() + 300
        while not (tmp_path / "o" / folder.INCOMPLETE).exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # into the steps
        run.send_signal(signal.SIGINT)
        try:
            err = run.communicate(timeout=60)[1].strip()
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGABRT)
            err = "no exit 60 s after SIGINT; " + run.communicate(timeout=60)[1]
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert err == "distpm: interrupted; --resume OUT goes on from the newest checkpoint, if any"
    assert (tmp_path / "o" / folder.INCOMPLETE).exists()


def test_ctrl_c_leaves_while_the_devices_compute(tmp_path):
    """The same in the middle of one long program: Python alone would raise
    KeyboardInterrupt only once the devices had finished it."""
    script = tmp_path / "long.py"
    script.write_text(
        "import jax\n"
        "from distpm.cli import main\n"
        "main._leave_at_once_on_ctrl_c()\n"
        "inner = lambda i, c: jax.lax.fori_loop(0, 2**20, lambda j, c: jax.numpy.sin(c), c)\n"
        "spin = jax.jit(lambda x: jax.lax.fori_loop(0, 2**20, inner, x))\n"
        "spin = spin.lower(1.0).compile()\n"
        "print('computing', flush=True)\n"
        "jax.block_until_ready(spin(1.0))\n"
        "print('finished', flush=True)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    run = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=default,
    )  # fmt: skip
    try:
        assert run.stdout.readline() == "computing\n"
        time.sleep(1)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)  # the loop takes hours
    finally:
        run.kill()
    assert (run.returncode, out, err.strip()) == (130, "", INTERRUPTED)


HALO_OVERFLOW = ["run", "--set", "mesh_shape=16", "--set", "n_steps=2", "--devices", "2x2"]
HALO_OVERFLOW += ["--set", "halos.linking_length=1.0", "--set", "halos.ghost_factor=0.001"]


def test_a_halo_finder_that_overflows_after_the_steps_tries_again_with_larger_buffers(
    tmp_path, capsys
):
    """FoF's ghost buffers too small for the particles near the faces (b = 1): the halos are
    found again with the least ghost_factor that holds them, and the run says so."""
    out = tmp_path / "o"
    assert main([*HALO_OVERFLOW, "--no-progress", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    raised = summary["halos"]["raised"]
    assert set(raised) == {"ghost_factor"} and raised["ghost_factor"] > 0.001, raised
    assert f"halos found with halos.ghost_factor = {raised['ghost_factor']}" in said, said
    assert summary["halos"]["groups"] > 0 and (out / "halos.txt").exists()
    assert not (out / folder.INCOMPLETE).exists()


def test_a_halo_finder_that_fails_after_the_steps_keeps_their_outputs(
    tmp_path, capsys, monkeypatch
):
    """The same without tries (as when larger buffers would not fit the devices): the run
    writes the spectra and the snapshot, says which output failed in the run file's terms,
    and leaves its folder marked incomplete."""
    from distpm import pipeline

    monkeypatch.setattr(pipeline, "RETRIES", 0)
    out = tmp_path / "o"
    assert main([*HALO_OVERFLOW, "--no-progress", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert "the halo finder failed after the steps:" in err, err
    assert "raise halos.ghost_factor to at least" in err, err
    assert "power.txt" in err and "snapdir_000" in err and "marked INCOMPLETE" in err, err
    assert (out / "power.txt").exists() and (out / "snapdir_000").is_dir()
    assert (out / folder.INCOMPLETE).exists() and not (out / "halos.txt").exists()


def test_every_file_of_a_run_is_written_under_a_temporary_name(tmp_path, monkeypatch):
    """Every file a run leaves, of every kind of output (spectra, fields, halos, snapshot,
    group files, multipoles, P(k) in the steps, lightcone maps and tables, figures), was
    written under a temporary name and moved into place whole (:mod:`distpm.io.partial`)."""
    from distpm.io import partial

    moved, writing = set(), partial.writing

    def recorded(path):
        moved.add(os.path.abspath(path))
        return writing(path)

    monkeypatch.setattr(partial, "writing", recorded)
    out = tmp_path / "o"
    sets = [
        "mesh_shape=8", "box_size=400.0", "a_start=0.4", "n_steps=3", "seed=4",
        "halos.min_members=2", "output.multipoles=true", "output.power_every=1",
        "lightcone.source_redshifts=[0.3]", "lightcone.nside=8", "lightcone.flat_fov=20.0",
        "lightcone.flat_pixels=16",
    ]  # fmt: skip
    args = ["run", *(x for s in sets for x in ("--set", s)), "--devices", "1x1"]
    assert main([*args, "--save-fields", "--no-progress", "--out", str(out)]) == 0
    files = {os.path.abspath(p) for p in out.rglob("*") if p.is_file()}
    kinds = {p.rsplit(".", 1)[-1] for p in files}
    assert kinds == {"txt", "png", "npy", "npz", "hdf5", "fits", "json"}, kinds
    assert files <= moved, sorted(files - moved)


@pytest.mark.parametrize("fault", [ValueError, KeyboardInterrupt])
def test_a_write_that_fails_otherwise_leaves_nothing_and_says_what_it_is(tmp_path, fault):
    """A bug or Ctrl-C in the middle of a write: no file under either name, and the error
    goes on unchanged (only the OS's faults become one line naming the file)."""
    from distpm.io import partial

    path = tmp_path / "table.txt"
    with pytest.raises(fault, match="half way"):
        with partial.opened(path) as f:
            f.write(b"the first half\n")
            raise fault("half way")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a file system of 256 kB (a tmpfs: needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)])
    if mounted.returncode:
        not_here("mounting a 256 kB tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


# h5py's objects of the failed file say it again as they are collected (the CLI drops those:
# partial.quiet_unwritable)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_is_one_line_and_leaves_no_partial_file(small_disk, capsys):
    """Refused before the steps where the outputs cannot fit; a write that meets a full disk
    all the same leaves nothing under a temporary name and says which file failed."""
    out = small_disk / "o"
    assert main([*RUN, "--set", "mesh_shape=32", "--out", str(out)]) == 2
    err = _one_line(capsys)
    need = "MB free but the run's snapshots, checkpoints and figures need about 1.12 MB"
    assert f"{out} has 0.2" in err and need in err, err  # 32^3 x 28 B, and 0.2 MB of figures
    assert sorted(p.name for p in out.iterdir()) == [folder.INCOMPLETE]  # no output began
    cfg = distpm.SimConfig(mesh_shape=32, box_size=64.0, parallel=(1, 1))
    state = distpm.initial_conditions(distpm.white_noise(0, cfg), distpm.Cosmology.planck18(), cfg)
    with pytest.raises(OSError, match="could not write .*snapshot_000.0.hdf5: No space left"):
        write_snapshot(small_disk / "snap", state, distpm.Cosmology.planck18(), cfg)
    assert list((small_disk / "snap").iterdir()) == []
