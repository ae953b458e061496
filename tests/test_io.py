"""Gadget-4 HDF5 snapshots and ICs: what h5py, yt and pynbody read equals distpm's own values."""

import h5py
import numpy as np
import pytest
from conftest import optional_import

import distpm
from distpm import pipeline, units
from distpm.cli.main import main
from distpm.io import read_snapshot, write_snapshot

COSMO = distpm.Cosmology.planck18()
CFG = distpm.SimConfig(
    mesh_shape=16,
    box_size=64.0,
    n_steps=3,
    a_stop=0.8,
    parallel={"exchange_factor": 0.3, "devices": (2, 2)},
)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """(final particles, snapshot base path) of a 2x2 run."""
    final = distpm.simulate(distpm.white_noise(0, CFG), COSMO, CFG)
    base = write_snapshot(tmp_path_factory.mktemp("snap"), final, COSMO, CFG, number=7)
    return final, base


def _expected(final):
    """distpm's own values by id, in the units readers report: x [Mpc/h], v_pec [km/s]."""
    a = float(final.a)
    return final.by_id("pos"), 100.0 * final.by_id("vel") / a, a


def _colossus_particle_mass():
    """[Msun/h] from colossus's critical density (an independent constant set)."""
    cosmology = optional_import("colossus.cosmology.cosmology")

    c = cosmology.setCosmology(
        "distpm", flat=True, H0=100 * COSMO.h, Om0=COSMO.Omega_m, Ob0=COSMO.Omega_b,
        sigma8=COSMO.sigma8, ns=COSMO.n_s, relspecies=False,
    )  # fmt: skip
    rho_m = c.rho_m(0.0) * 1e9  # Msun h^2 / kpc^3 -> per (Mpc/h)^3
    return rho_m * np.prod(CFG.box_size) / CFG.n_particles


def test_every_attribute_gadget4_writes(snapshot):
    final, base = snapshot
    with h5py.File(f"{base}.0.hdf5", "r") as f:
        assert sorted(f) == ["Header", "Parameters", "PartType1"]  # no Units/Constants/Cosmology
        h, p = dict(f["Header"].attrs), dict(f["Parameters"].attrs)
        n = CFG.n_particles
        for key in ("NumPart_ThisFile", "NumPart_Total"):
            assert h[key].dtype == np.uint64 and list(h[key]) == [0, n, 0, 0, 0, 0]
        assert list(h["NumPart_Total_HighWord"]) == [0] * 6
        mass = h["MassTable"][1] * 1e10
        assert mass == pytest.approx(_colossus_particle_mass(), rel=1e-4)
        assert h["Time"] == 0.8 and h["Redshift"] == pytest.approx(0.25, abs=1e-15)
        assert h["BoxSize"] == p["BoxSize"] == 64000.0  # kpc/h
        assert h["NumFilesPerSnapshot"] == p["NumFilesPerSnapshot"] == 1
        for key, value in (("Omega0", COSMO.Omega_m), ("OmegaLambda", 1 - COSMO.Omega_m)):
            assert h[key] == p[key] == pytest.approx(value, abs=1e-15)
        assert h["HubbleParam"] == p["HubbleParam"] == COSMO.h
        assert p["OmegaBaryon"] == COSMO.Omega_b
        assert p["UnitLength_in_cm"] == pytest.approx(3.0856775814913673e21, rel=1e-15)
        assert p["UnitMass_in_g"] == pytest.approx(1.98841e43, rel=1e-5)
        assert p["UnitVelocity_in_cm_per_s"] == 1e5
        assert p["ComovingIntegrationOn"] == 1
        assert (p["TimeBegin"], p["TimeMax"]) == (0.1, 0.8)
        assert p["SnapshotFileBase"] == "snapshot"
        group = f["PartType1"]
        x, u = group["Coordinates"][:], group["Velocities"][:]
        ids = group["ParticleIDs"][:]
        scalings = {
            "Coordinates": (1, 0, 1, -1, p["UnitLength_in_cm"]),
            "Velocities": (0, 1, 0.5, 0, 1e5),
            "ParticleIDs": (0, 0, 0, 0, 0),
        }
        for name, want in scalings.items():
            a = group[name].attrs
            got = tuple(a[k] for k in ("length_scaling", "velocity_scaling", "a_scaling"))
            got += (a["h_scaling"], a["to_cgs"])
            assert got == want and a["mass_scaling"] == 0, name
    assert x.dtype == u.dtype == np.float32 and ids.dtype == np.uint64
    assert ids.min() == 1 and np.array_equal(np.sort(ids), np.arange(1, n + 1, dtype=np.uint64))
    assert x.min() >= 0 and x.max() < 64000.0
    # Gadget's velocity convention, from distpm's canonical momentum p = a^2 dx/dt:
    # v_pec = a dx/dt = p / a [100 km/s]; u = v_pec / sqrt(a)
    pos, v_pec, a = _expected(final)
    order = np.argsort(ids)
    np.testing.assert_allclose(x[order], 1000 * pos, rtol=1e-6, atol=1e-3)
    np.testing.assert_allclose(u[order], v_pec / np.sqrt(a), rtol=1e-5, atol=1e-4)
    assert np.abs(v_pec).max() > 100  # km/s: a test of the conversion, not of zeros


def test_yt_reads_positions_velocities_masses_and_cosmology(snapshot):
    yt = pytest.importorskip("yt")
    final, base = snapshot
    ds = yt.load(f"{base}.0.hdf5")
    data = ds.all_data()
    order = np.argsort(data["PartType1", "particle_index"].d)
    pos, v_pec, a = _expected(final)
    x = data["PartType1", "particle_position"].to("Mpccm/h").d[order]
    v = data["PartType1", "particle_velocity"].to("km/s").d[order]
    m = data["PartType1", "particle_mass"].to("Msun/h").d
    np.testing.assert_allclose(x, pos, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v, v_pec, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(m, _colossus_particle_mass(), rtol=1e-4)
    assert len(m) == CFG.n_particles
    np.testing.assert_allclose(ds.domain_width.to("Mpccm/h").d, 64.0, rtol=1e-12)
    assert ds.current_redshift == pytest.approx(1 / a - 1, rel=1e-6)
    assert ds.omega_matter == pytest.approx(COSMO.Omega_m) and ds.hubble_constant == COSMO.h


def test_pynbody_reads_positions_velocities_masses_and_cosmology(snapshot):
    pynbody = pytest.importorskip("pynbody")
    final, base = snapshot
    with pytest.warns(UserWarning):  # masses from the header: pynbody says it assumes 1/h
        sim = pynbody.load(str(base))
        order = np.argsort(sim["iord"])
        m = sim["mass"].in_units("Msol h**-1")
    pos, v_pec, a = _expected(final)
    np.testing.assert_allclose(sim["pos"].in_units("Mpc a h**-1")[order], pos, atol=2e-5)
    np.testing.assert_allclose(sim["vel"].in_units("km s**-1")[order], v_pec, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(m, _colossus_particle_mass(), rtol=1e-4)
    props = sim.properties
    assert props["a"] == pytest.approx(a) and props["h"] == COSMO.h
    assert props["omegaM0"] == pytest.approx(COSMO.Omega_m)
    assert float(props["boxsize"].in_units("Mpc a h**-1")) == pytest.approx(64.0, rel=1e-6)


@pytest.mark.parametrize("grid", [(1, 1), (4, 2)])
def test_read_snapshot_onto_another_grid(snapshot, grid):
    final, base = snapshot
    cfg = CFG.on(grid)
    back = read_snapshot(base.parent, cfg)
    assert back.count == CFG.n_particles and float(back.a) == pytest.approx(0.8)
    np.testing.assert_array_equal(back.by_id("ids"), final.by_id("ids"))
    np.testing.assert_allclose(back.by_id("pos"), final.by_id("pos"), atol=4e-6)  # float32 kpc/h
    np.testing.assert_allclose(back.by_id("vel"), final.by_id("vel"), rtol=1e-6, atol=1e-6)
    # each particle sits on the device that owns its position
    density = distpm.density(back, cfg)
    np.testing.assert_allclose(density, distpm.density(final, CFG), atol=2e-5)


SETTINGS = ["--set", "mesh_shape=16", "--set", "box_size=64.0", "--set", "n_steps=3"]
SETTINGS += ["--set", "a_stop=0.8", "--set", "parallel.exchange_factor=0.3", "--no-progress"]


def test_ics_round_trip_evolves_to_the_same_density(tmp_path):
    assert main(["ics", *SETTINGS[:-1], "--devices", "2x2", "--out", str(tmp_path)]) == 0
    base = tmp_path / "ics" / "ics"
    noise = distpm.white_noise(0, CFG)
    ics = distpm.initial_conditions(noise, COSMO, CFG)
    back = read_snapshot(base, CFG)
    np.testing.assert_array_equal(back.by_id("pos"), ics.by_id("pos"))  # float64 on disk
    np.testing.assert_array_equal(back.by_id("vel"), ics.by_id("vel"))
    direct = distpm.density(distpm.simulate(noise, COSMO, CFG), CFG)
    via_file = distpm.density(distpm.evolve(back, COSMO, CFG)[-1], CFG)
    assert np.max(np.abs(via_file - direct)) <= 1e-6 * np.max(np.abs(direct))
    # distpm run --ics: the same run, started from the file
    out = tmp_path / "from_ics"
    args = ["run", *SETTINGS, "--devices", "2x2", "--ics", str(base), "--save-fields"]
    assert main([*args, "--out", str(out)]) == 0
    from_cli = np.load(out / "density.npy")
    assert np.max(np.abs(from_cli - direct)) <= 1e-6 * np.max(np.abs(direct))
    # the same seed gives the same ICs on another grid
    one = pipeline.write_ics(CFG.on((1, 1)), COSMO, tmp_path / "one")
    with h5py.File(f"{base}.0.hdf5") as f, h5py.File(f"{one}.0.hdf5") as g:
        a, b = f["PartType1"], g["PartType1"]
        ia, ib = np.argsort(a["ParticleIDs"][:]), np.argsort(b["ParticleIDs"][:])
        np.testing.assert_allclose(a["Coordinates"][:][ia], b["Coordinates"][:][ib], atol=1e-3)
        np.testing.assert_allclose(a["Velocities"][:][ia], b["Velocities"][:][ib], atol=1e-3)


def test_ics_at_another_time_or_of_another_cosmology_are_refused(tmp_path, capsys):
    assert main(["ics", *SETTINGS[:-1], "--devices", "2x2", "--out", str(tmp_path)]) == 0
    args = ["run", *SETTINGS, "--set", "a_start=0.05", "--ics", str(tmp_path / "ics")]
    assert main([*args, "--devices", "2x2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "are at a=0.1 but a_start is 0.05" in err, err
    args = ["run", *SETTINGS, "--set", "cosmology.h=0.7", "--ics", str(tmp_path / "ics")]
    assert main([*args, "--devices", "2x2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    made = "were made with HubbleParam=0.6766 but this run has HubbleParam=0.7"
    assert len(err.splitlines()) == 1 and made in err, err
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_ids_are_one_based_lagrangian_indices(tmp_path):
    # at a_start every particle sits near its lattice site (i, j, l) * spacing + half a cell,
    # which ParticleIDs - 1 = (i * Ny + j) * Nz + l must name; spacing 4 Mpc/h here
    ics = distpm.initial_conditions(distpm.white_noise(0, CFG), COSMO, CFG)
    base = write_snapshot(tmp_path, ics, COSMO, CFG, number=None, base="ics", double=True)
    with h5py.File(f"{base}.0.hdf5") as f:
        ids = f["PartType1/ParticleIDs"][:].astype(np.int64)
        x = f["PartType1/Coordinates"][:] / 1000.0
    assert ids.min() == 1
    site = np.stack(np.unravel_index(ids - 1, CFG.particle_shape), axis=1) * 4.0 + 2.0
    offset = np.abs(x - site)
    offset = np.minimum(offset, 64.0 - offset)  # periodic
    # an id off by one would put every particle 4 Mpc/h (a site) from its own site
    assert offset.max() < 3.0 and np.sqrt(np.mean(offset**2)) < 1.0
    assert offset.max() > 0.1  # the particles did move off the lattice


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def test_bad_snapshot_files_are_one_clear_error(snapshot, tmp_path, capsys):
    _, base = snapshot
    good = base.with_name(base.name + ".0.hdf5")
    truncated = tmp_path / "cut.hdf5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.hdf5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.zeros(3)
    many = _copy(good, tmp_path / "many.0.hdf5")
    with h5py.File(many, "a") as f:
        f["Header"].attrs["NumFilesPerSnapshot"] = np.int32(2)
    cases = {
        truncated: "not a readable HDF5 file (truncated file",
        foreign: "not a Gadget snapshot (no /Header group)",
        tmp_path / "many": "has 2 files (NumFilesPerSnapshot) but ['many.1.hdf5'] are missing",
        tmp_path / "absent": "absent.hdf5 does not exist",
    }
    for path, message in cases.items():  # distpm run --ics PATH: exit status 2, one line
        args = ["run", *SETTINGS, "--devices", "2x2", "--ics", str(path), "--out", str(tmp_path)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    with pytest.raises(ValueError, match="holds 4096 particles but particle_shape"):
        read_snapshot(good, CFG.replace(mesh_shape=32, particle_shape=8))
    with pytest.raises(ValueError, match="BoxSize 64.0 Mpc/h but box_size"):
        read_snapshot(good, CFG.replace(box_size=100.0))


def _flip(path, dataset, n=64):
    """Invert n bytes in the middle of the first chunk of ``dataset`` of the HDF5 file."""
    with h5py.File(path) as f:
        chunk = f[dataset].id.get_chunk_info(0)
    at = chunk.byte_offset + max(0, chunk.size // 2 - n // 2)
    with open(path, "r+b") as f:
        f.seek(at)
        data = f.read(min(n, chunk.size))
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("kind", ["snapshot", "ics"])
def test_a_damaged_dataset_is_refused_naming_it(snapshot, kind, tmp_path):
    """Every dataset has Fletcher32 checksums: h5py (and so yt and pynbody) refuses a damaged
    chunk, and distpm's reader says which file and dataset."""
    if kind == "ics":
        base = pipeline.write_ics(CFG, COSMO, tmp_path / "made")
    else:
        base = snapshot[1]
    good = base.with_name(base.name + ".0.hdf5")
    names = ("Coordinates", "Velocities", "ParticleIDs")
    with h5py.File(good) as f:
        assert all(f["PartType1"][name].fletcher32 for name in names)
    for name in names:
        damaged = _copy(good, tmp_path / f"{name}.0.hdf5")
        _flip(damaged, f"PartType1/{name}")
        with h5py.File(damaged) as f, pytest.raises(OSError, match="filter returned failure"):
            f["PartType1"][name][:]  # HDF5's words for a Fletcher32 mismatch
        with pytest.raises(OSError, match=f"dataset /PartType1/{name} is damaged"):
            read_snapshot(damaged, CFG)


def test_critical_density_matches_the_standard_value():
    # PDG (Astrophysical constants): rho_c = 2.77536627e11 h^2 Msun Mpc^-3
    assert units.critical_density() == pytest.approx(27.7536627, rel=1e-7)
