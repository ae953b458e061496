"""`distpm run` with halos: the catalogue (text, npz and Gadget-4 files) holds scipy's groups
of the final snapshot, and h5py, yt and pynbody read the Gadget-4 files as distpm wrote them."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

A = 0.8  # the run's final a: Gadget's GroupVel is a v_pec, so a = 1 would hide a missing factor
BOX = 64.0
KPC_CM = 3.0856775814913673e21
YT_UNITS = {"UnitLength_in_cm": KPC_CM, "UnitVelocity_in_cm_per_s": 1e5}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(output directory, snapshot ids and positions [Mpc/h] in file order, scipy's groups
    of >= 10 members as {smallest id: sorted member ids}) of a run with ``[halos]``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    tmp = tmp_path_factory.mktemp("halos")
    config = tmp / "halos.toml"
    config.write_text(
        f"box_size = {BOX}\nmesh_shape = 32\nn_steps = 10\na_start = 0.1\na_stop = {A}\n"
        "[output]\nsnapshot_double = true\n[halos]\nmin_members = 10\n"
    )
    out = tmp / "out"
    result = subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", "run", str(config), "--out", str(out)]
        + ["--no-progress"],
        cwd=tmp,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    with h5py.File(out / "snapdir_000" / "snapshot_000.0.hdf5") as f:
        pos = f["PartType1/Coordinates"][:] / 1000.0  # kpc/h -> Mpc/h
        ids = f["PartType1/ParticleIDs"][:].astype(np.int64)  # 1-based
    pairs = cKDTree(np.mod(pos, BOX), boxsize=BOX).query_pairs(0.2 * 2.0, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), pairs.T), shape=(len(pos),) * 2)
    _, comp = connected_components(graph, directed=False)
    order = np.lexsort((ids, comp))
    starts = np.flatnonzero(np.r_[True, np.diff(comp[order]) != 0])
    groups = {}
    for members in np.split(ids[order], starts[1:]):
        if len(members) >= 10:
            groups[int(members[0])] = members
    return out, ids, pos, groups


def _files(out, kind):
    pattern = {"groups": "groups_000/fof_subhalo_tab_000.*.hdf5"}.get(kind, kind)
    return sorted(out.glob(pattern))


def test_every_dataset_of_the_group_files_has_checksums_that_readers_check(run, tmp_path):
    out = run[0]
    (path,) = _files(out, "groups")
    with h5py.File(path) as f:
        names = []
        f.visititems(lambda name, x: names.append(name) if isinstance(x, h5py.Dataset) else None)
        assert "Group/GroupMass" in names and "IDs/ID" in names
        assert all(f[name].fletcher32 for name in names)
        chunk = f["Group/GroupMass"].id.get_chunk_info(0)
    damaged = tmp_path / path.name
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset : chunk.byte_offset + 8] = bytes(8)  # zero the first two masses
    damaged.write_bytes(bytes(data))
    with h5py.File(damaged) as f, pytest.raises(OSError, match="filter returned failure"):
        f["Group/GroupMass"][:]  # HDF5's words for a Fletcher32 mismatch


def test_the_catalogue_holds_scipys_groups_of_the_snapshot(run):
    out, ids, _, groups = run
    table = np.loadtxt(out / "halos.txt", ndmin=2)
    want = sorted((-len(m), label - 1) for label, m in groups.items())
    got = list(zip(-table[:, 1].astype(int), table[:, 0].astype(int), strict=True))
    assert len(want) > 50 and got == want
    saved = np.load(out / "halos.npz")
    assert saved["min_members"] == 10 and list(saved["n"]) == list(table[:, 1])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["halos"]["groups"] == len(want) and summary["halos"]["min_members"] == 10
    assert "groups_000" in summary["outputs"]
    # Gadget-4's layout: each group's members are consecutive in the snapshot, groups in
    # catalogue order, then the particles of no group; IDs/ID lists the members
    (path,) = _files(out, "groups")
    with h5py.File(path) as f:
        length, offset = f["Group/GroupLen"][:], f["Group/GroupOffsetType"][:, 1]
        member_ids = f["IDs/ID"][:]
    assert np.array_equal(offset, np.cumsum(length) - length)
    assert np.array_equal(member_ids, ids[: length.sum()])
    for label, n, start in zip(table[:, 0].astype(int), length, offset, strict=True):
        assert np.array_equal(ids[start : start + n], groups[label + 1])  # sorted by id


def test_every_catalogue_attribute(run):
    out, ids, _, groups = run
    cat = np.load(out / "halos.npz")
    (path,) = _files(out, "groups")
    with h5py.File(path) as f:
        assert sorted(f) == ["Group", "Header", "IDs", "Subhalo"] and len(f["Subhalo"]) == 0
        h = dict(f["Header"].attrs)
        n_groups, n_ids = len(cat["n"]), int(cat["n"].sum())
        for key, value in (("Ngroups", n_groups), ("Nids", n_ids), ("Nsubhalos", 0)):
            assert h[f"{key}_ThisFile"] == h[f"{key}_Total"] == value, key
        assert h["Nsubgroups_ThisFile"] == h["Nsubgroups_Total"] == 0  # Arepo's names
        assert h["NumFiles"] == 1 and f["Group"].attrs["NTask"] == 1
        assert h["Time"] == pytest.approx(A, rel=1e-6)
        assert h["Redshift"] == pytest.approx(1 / A - 1, rel=1e-5)
        assert h["BoxSize"] == 1000 * BOX
        assert (h["Omega0"], h["HubbleParam"]) == pytest.approx((0.3111, 0.6766))
        assert h["Omega0"] + h["OmegaLambda"] == pytest.approx(1.0)
        g = {name: f["Group"][name][:] for name in f["Group"]}
        units = {name: dict(f["Group"][name].attrs) for name in f["Group"]}
    n = cat["n"]
    assert np.array_equal(g["GroupLen"], n) and np.array_equal(g["GroupLenType"][:, 1], n)
    others = np.delete(np.arange(6), 1)
    assert not g["GroupLenType"][:, others].any() and not g["GroupOffsetType"][:, others].any()
    np.testing.assert_allclose(g["GroupMass"], cat["mass"], rtol=1e-6)
    np.testing.assert_array_equal(g["GroupMassType"][:, 1], g["GroupMass"])
    np.testing.assert_allclose(g["GroupPos"], 1000 * cat["pos"], rtol=1e-6)
    np.testing.assert_allclose(g["GroupVel"], A * cat["vel"], rtol=1e-5, atol=1e-4)
    assert np.abs(cat["vel"]).max() > 100  # km/s: the factor a is tested on real velocities
    np.testing.assert_allclose(g["DistpmRadiusRMS"], 1000 * cat["r_rms"], rtol=1e-6)
    np.testing.assert_allclose(g["DistpmVelDisp"], cat["sigma_v"], rtol=1e-6)
    np.testing.assert_allclose(g["DistpmLagrangianPos"], 1000 * cat["lagrangian_pos"], rtol=1e-6)
    assert np.array_equal(g["DistpmLabel"], cat["label"] + 1)  # the smallest member ParticleID
    assert set(g["DistpmLabel"]) == set(groups)
    for field, name in (("M_Mean200", "m200m"), ("M_Crit200", "m200c")):
        np.testing.assert_allclose(g[f"Group_{field}"], cat[name], rtol=1e-6)
        assert units[f"Group_{field}"] == units["GroupMass"]
    for field, name in (("R_Mean200", "r200m"), ("R_Crit200", "r200c")):
        np.testing.assert_allclose(g[f"Group_{field}"], 1000 * cat[name], rtol=1e-6)
        assert units[f"Group_{field}"] == units["GroupPos"]
    assert (cat["m200m"] > 0).sum() > len(n) // 2 and np.all(cat["m200c"] <= cat["m200m"])
    table = np.loadtxt(out / "halos.txt", ndmin=2)
    so = np.stack([cat[k] for k in ("m200m", "r200m", "m200c", "r200c")], axis=1)
    np.testing.assert_allclose(table[:, -4:], so, rtol=1e-6, atol=5e-6)  # radii to 1e-5 Mpc/h
    assert not g["GroupNsubs"].any() and (g["GroupFirstSub"] == -1).all()
    np.testing.assert_allclose(g["GroupAscale"], A, rtol=1e-6)
    # Gadget-4's unit attributes: value [cgs] = x a^a_scaling h^h_scaling to_cgs
    scaling = lambda name: tuple(units[name][k] for k in ("a_scaling", "h_scaling", "to_cgs"))  # noqa: E731
    assert scaling("GroupPos") == (1.0, -1.0, pytest.approx(KPC_CM))
    assert scaling("GroupVel") == (-1.0, 0.0, 1e5)  # v_pec = GroupVel / a
    assert scaling("GroupMass") == (0.0, -1.0, pytest.approx(1.98841e43, rel=1e-5))


def test_yt_reads_the_catalogue_and_each_groups_members(run):
    yt = pytest.importorskip("yt")
    out, _, _, groups = run
    cat = np.load(out / "halos.npz")
    ds = yt.load(str(_files(out, "groups")[0]), unit_base=dict(YT_UNITS))
    data = ds.all_data()
    np.testing.assert_array_equal(data["Group", "particle_number"].d, cat["n"])
    mass = data["Group", "particle_mass"].to("Msun/h").d
    np.testing.assert_allclose(mass, 1e10 * cat["mass"], rtol=1e-6)
    pos = data["Group", "particle_position"].to("Mpccm/h").d
    np.testing.assert_allclose(pos, cat["pos"], rtol=1e-6, atol=1e-6)
    m200 = data["Group", "Group_M_Mean200"].to("Msun/h").d
    np.testing.assert_allclose(m200, 1e10 * cat["m200m"], rtol=1e-6)
    r200 = data["Group", "Group_R_Crit200"].to("Mpccm/h").d
    np.testing.assert_allclose(r200, cat["r200c"], rtol=1e-6, atol=1e-9)
    for i in (0, 1, len(cat["n"]) // 2, len(cat["n"]) - 1):
        halo = ds.halo("Group", i)
        members = np.sort(halo["Group", "member_ids"].d.astype(np.int64))
        assert np.array_equal(members, groups[int(cat["label"][i]) + 1])
        v_pec = halo.velocity.to("km/s").d / A  # yt reads GroupVel as given
        np.testing.assert_allclose(v_pec, cat["vel"][i], rtol=1e-5, atol=1e-3)


def test_pynbody_finds_each_groups_particles_in_the_snapshot(run):
    pynbody = pytest.importorskip("pynbody")
    out, _, pos, groups = run
    cat = np.load(out / "halos.npz")
    with pytest.warns(UserWarning):  # masses from the header: pynbody says it assumes 1/h
        sim = pynbody.load(str(out / "snapdir_000" / "snapshot_000"))
        halos = sim.halos(filename=str(out / "groups_000" / "fof_subhalo_tab_000"))
    assert len(halos) == len(cat["n"])
    for i in range(len(halos)):
        assert np.array_equal(halos[i]["iord"], groups[int(cat["label"][i]) + 1])
    m200 = halos[0].properties["Group_M_Mean200"].in_units("1e10 Msol h**-1")
    # pynbody's solar mass (1.98842e33 g) is 5.1e-6 above Gadget-4's unit mass / 1e10
    assert float(m200) == pytest.approx(cat["m200m"][0], rel=1e-5)
    x = halos[0]["pos"].in_units("Mpc a h**-1")  # the largest group's particles, read back
    d = x - cat["pos"][0]
    d -= BOX * np.round(d / BOX)
    assert np.sqrt(np.mean(np.sum(d * d, axis=1))) == pytest.approx(cat["r_rms"][0], rel=1e-5)
    assert len(pos) == len(sim)
