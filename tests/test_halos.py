"""Friends-of-friends and the halo catalogue against scipy's cKDTree and float64 numpy."""

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

import distpm
from distpm.analysis.fof import linking_distance
from distpm.shares import from_rows
from distpm.state import lagrangian_offset, linear_ids
from distpm.units import particle_mass

COSMO = distpm.Cosmology.planck18()
BOX = 64.0
CFG = distpm.SimConfig(
    mesh_shape=32, box_size=BOX, n_steps=10, a_start=0.1, parallel={"exchange_factor": 0.3}
)
MIN_MEMBERS = 20


@pytest.fixture(scope="module")
def run():
    """Final particles of a 32^3 PM run in 64 Mpc/h (2 Mpc/h per particle, clustered)."""
    return distpm.simulate(distpm.white_noise(0, CFG), COSMO, CFG)


@pytest.fixture(scope="module")
def reference(run):
    """scipy's groups of the run's particles, by id: (pos, vel, ids, labels) in float64."""
    pos = run.by_id("pos").astype(np.float64)
    vel = run.by_id("vel").astype(np.float64)
    ids = np.arange(CFG.n_particles)  # by_id sorts by the Lagrangian index
    return pos, vel, ids, scipy_labels(pos, linking_distance(CFG, 0.2), MIN_MEMBERS)


def scipy_labels(pos, distance, min_members):
    """Smallest member row of each point's group (periodic), -1 below min_members."""
    pairs = cKDTree(np.mod(pos, BOX), boxsize=BOX).query_pairs(distance, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(len(pos),) * 2)
    _, comp = connected_components(graph, directed=False)
    smallest = np.full(comp.max() + 1, len(pos))
    np.minimum.at(smallest, comp, np.arange(len(pos)))
    return np.where(np.bincount(comp)[comp] >= min_members, smallest[comp], -1)


def by_id(particles, labels, cfg):
    """Labels (as Lagrangian indices, -1 for none) of the valid slots, in id order."""
    mask = np.asarray(particles.mask)
    ids = linear_ids(np.asarray(particles.ids)[mask], cfg.particle_shape)
    labels = np.asarray(labels)[mask]
    return linear_ids(labels, cfg.particle_shape)[np.argsort(ids)]


def placed(reference, cfg, seed):
    """The reference particles on ``cfg``'s grid, read in a shuffled order."""
    pos, vel, ids, _ = reference
    order = np.random.default_rng(seed).permutation(len(ids))
    _, ny, nz = cfg.particle_shape
    words = np.stack([ids // (ny * nz), ids % (ny * nz)], axis=1)

    def rows(start, stop):
        take = order[start:stop]
        return {"pos": pos[take], "vel": vel[take], "ids": words[take]}

    return from_rows(rows, len(ids), CFG.a_stop, cfg)


def reference_catalogue(reference, a):
    """The catalogue of the reference groups in float64 numpy, sorted as distpm sorts."""
    pos, vel, ids, labels = reference
    n = CFG.particle_shape[0]
    q = np.stack(np.unravel_index(ids, CFG.particle_shape), axis=1) * BOX / n
    q += lagrangian_offset(CFG)
    rows = []
    for label in np.unique(labels[labels >= 0]):
        members = labels == label
        x, v = pos[members], 100.0 * vel[members] / a
        d = x - x[0]
        d -= BOX * np.round(d / BOX)
        dq = q[members] - q[members][0]
        dq -= BOX * np.round(dq / BOX)
        r2 = np.sum((d - d.mean(0)) ** 2, axis=1).mean()
        s2 = np.sum((v - v.mean(0)) ** 2, axis=1).mean() / 3
        centre, lagr = np.mod(x[0] + d.mean(0), BOX), np.mod(q[members][0] + dq.mean(0), BOX)
        rows.append((members.sum(), label, centre, v.mean(0), np.sqrt(s2), np.sqrt(r2), lagr))
    rows.sort(key=lambda r: (-r[0], r[1]))
    fields = ("n", "label", "pos", "vel", "sigma_v", "r_rms", "lagrangian_pos")
    return {f: np.array([r[i] for r in rows]) for i, f in enumerate(fields)}


def numpy_overdensity(pos, centres, radius, delta):
    """Per centre, J (the outermost particle within ``radius`` whose sphere holds a mean
    density of at least ``delta`` times the mean) in float64, and whether a float32
    distance could decide otherwise (a ratio within 1e-5 of the threshold or the radius)."""
    density = CFG.n_particles / BOX**3
    tree = cKDTree(np.mod(pos, BOX), boxsize=BOX)
    found, unsure = [], []
    for c, r in zip(centres, radius, strict=True):
        d = pos[tree.query_ball_point(c, r * 1.001)] - c
        d = np.sort(np.sqrt(np.sum((d - BOX * np.round(d / BOX)) ** 2, axis=1)))
        near = np.any(np.abs(d / r - 1) < 1e-5)
        d = d[d <= r]
        ratio = np.arange(1, len(d) + 1) / (delta * density * 4 * np.pi / 3 * d**3)
        found.append(np.flatnonzero(ratio >= 1).max(initial=-1) + 1)
        unsure.append(near or np.any(np.abs(ratio - 1) < 1e-5))
    return np.array(found), np.array(unsure)


def search_radius(n):
    """The catalogue's search radius: twice that of n particles at 200 times the mean."""
    return 2 * np.cbrt(3 * n / (4 * np.pi * 200 * CFG.n_particles / BOX**3))


def test_fof_of_a_run_equals_scipy(run, reference):
    words = distpm.fof(run, CFG)
    labels = by_id(run, words, CFG)
    expected = reference[3]
    assert (expected >= 0).sum() > 1000 and len(np.unique(expected[expected >= 0])) > 50
    np.testing.assert_array_equal(labels, expected)
    # the labels' one index form indexes by_id: a label is its group's smallest member's id
    grouped = labels >= 0
    np.testing.assert_array_equal(
        linear_ids(run.by_id("ids")[labels[grouped]], CFG.particle_shape), labels[grouped]
    )
    empty = ~np.asarray(run.mask)
    assert empty.any() and np.all(np.asarray(words)[empty] == -1)


def test_groups_cross_the_box_and_the_pencils(reference):
    """The test data has groups that wrap around the box and span several 4x2 blocks."""
    pos, _, _, labels = reference
    wraps = spans = 0
    for label in np.unique(labels[labels >= 0]):
        x = np.mod(pos[labels == label], BOX)
        wraps += np.any(np.ptp(x, axis=0) > BOX / 2)
        blocks = {(int(i), int(j)) for i, j in np.floor(x[:, :2] / [BOX / 4, BOX / 2])}
        spans += len(blocks) > 1
    assert wraps >= 2 and spans >= 5


@pytest.mark.parametrize("devices", [(1, 1), (2, 1), (2, 2), (4, 2), (2, 4)])
def test_same_labels_and_catalogue_on_every_grid(reference, devices):
    cfg = CFG.on(devices)
    particles = placed(reference, cfg, seed=sum(devices))
    labels = distpm.fof(particles, cfg)
    np.testing.assert_array_equal(by_id(particles, labels, cfg), reference[3])

    got = distpm.halo_catalogue(particles, labels, COSMO, cfg)
    want = reference_catalogue(reference, CFG.a_stop)
    np.testing.assert_array_equal(got.n, want["n"])
    np.testing.assert_array_equal(got.label, want["label"])
    mass = particle_mass(COSMO, CFG)
    np.testing.assert_allclose(got.mass, want["n"] * mass, rtol=1e-12)
    for field in ("sigma_v", "r_rms"):
        np.testing.assert_allclose(getattr(got, field), want[field], rtol=1e-5)
    # vectors: relative to the largest component of the table
    for field in ("pos", "vel", "lagrangian_pos"):
        scale = np.abs(want[field]).max()
        np.testing.assert_allclose(getattr(got, field), want[field], rtol=0, atol=1e-5 * scale)

    # spherical overdensity, counting every particle (members or not), around this grid's
    # centres and around the reference's (the same centres on every grid: the same counts)
    pos, density = reference[0], CFG.n_particles / BOX**3
    around_ref = distpm.spherical_overdensity(
        particles, want["pos"], search_radius(want["n"]), COSMO, cfg
    )
    assert not around_ref["open"].any()
    for name, delta in distpm.analysis.overdensity.thresholds(COSMO, CFG.a_stop).items():
        for centres, counts in (
            (got.pos, np.round(getattr(got, f"m{name}") / mass)),
            (want["pos"], around_ref[f"N{name}"]),
        ):
            centres = centres.astype(np.float32).astype(np.float64)  # as the devices take them
            expected, unsure = numpy_overdensity(pos, centres, search_radius(want["n"]), delta)
            assert unsure.sum() <= 1 and np.count_nonzero(expected) > 40
            np.testing.assert_array_equal(counts[~unsure], expected[~unsure])
        n, r = around_ref[f"N{name}"], around_ref[f"R{name}"]
        np.testing.assert_allclose(r, np.cbrt(3 * n / (4 * np.pi * delta * density)), rtol=1e-12)
        np.testing.assert_allclose(around_ref[f"M{name}"], n * mass, rtol=1e-12)
        assert np.array_equal(getattr(got, f"r{name}") > 0, getattr(got, f"m{name}") > 0)


def test_overdensity_spheres_reaching_the_search_radius_are_searched_again(run, monkeypatch):
    """Search radii a third of the catalogue's: where the outermost particle within one
    qualifies, that centre is searched again, twice as far, until it does not; and windows
    of 256 candidates, fewer than a large group has, are grown to hold them."""
    from distpm.analysis import overdensity

    cat = distpm.halo_catalogue(run, distpm.fof(run, CFG), COSMO, CFG)
    first = search_radius(cat.n) / 3
    small = distpm.spherical_overdensity(run, cat.pos, first, COSMO, CFG)
    again = small["search"] > first
    assert again.sum() > 10 and np.all(np.isin(small["search"][again] / first[again], [2, 4, 8]))
    pos = run.by_id("pos").astype(np.float64)
    centres = cat.pos.astype(np.float32).astype(np.float64)
    expected, unsure = numpy_overdensity(pos, centres, small["search"], 200.0)
    assert unsure.sum() <= 1
    np.testing.assert_array_equal(small["N200m"][~unsure], expected[~unsure])

    monkeypatch.setattr(overdensity, "_first_window", lambda capacity: 256)
    narrow = distpm.spherical_overdensity(run, cat.pos, search_radius(cat.n), COSMO, CFG)
    for name in ("N200m", "N200c"):
        np.testing.assert_array_equal(
            narrow[name], np.round(getattr(cat, f"m{name[1:]}") / (cat.mass[0] / cat.n[0]))
        )
    with pytest.raises(ValueError, match=r"search radii must be in \[0, "):
        distpm.spherical_overdensity(run, cat.pos, BOX, COSMO, CFG)


def test_fof_of_positions_in_any_order(reference):
    """A plain (N, 3) array: labels are the smallest row of each group, rows in input order."""
    pos = reference[0]
    order = np.random.default_rng(3).permutation(len(pos))
    cfg = CFG.on((2, 2))
    labels = distpm.fof_points(pos[order].astype(np.float32), cfg)
    expected = scipy_labels(pos[order], linking_distance(CFG, 0.2), MIN_MEMBERS)
    np.testing.assert_array_equal(labels, expected)


def test_other_linking_length_and_minimum(run):
    labels = by_id(run, distpm.fof(run, CFG, linking_length=0.28, min_members=5), CFG)
    pos = run.by_id("pos").astype(np.float64)
    expected = scipy_labels(pos, linking_distance(CFG, 0.28), 5)
    assert len(np.unique(expected)) > len(np.unique(by_id(run, distpm.fof(run, CFG), CFG)))
    np.testing.assert_array_equal(labels, expected)


def test_dense_linking_keeps_every_pair(reference):
    """Pairs are joined as they are found: more than 8 per particle (what the list of pairs
    FoF kept before held at its default) still give scipy's groups on 4x2."""
    cfg = CFG.on((4, 2))
    pos = reference[0]
    distance = linking_distance(CFG, 0.6)
    pairs = cKDTree(np.mod(pos, BOX), boxsize=BOX).query_pairs(distance, output_type="ndarray")
    assert len(pairs) > 8 * len(pos)
    particles = placed(reference, cfg, seed=2)
    labels = distpm.fof(particles, cfg, linking_length=0.6, min_members=5)
    np.testing.assert_array_equal(by_id(particles, labels, cfg), scipy_labels(pos, distance, 5))


def test_small_buffers_raise_with_the_value_to_set(reference):
    cfg = CFG.on((4, 2))
    particles = placed(reference, cfg, seed=0)
    with pytest.raises(distpm.CapacityError, match=r"raise ghost_factor to at least"):
        distpm.fof(particles, cfg, ghost_factor=0.01)
    labels = distpm.fof(particles, cfg, min_members=2)
    with pytest.raises(distpm.CapacityError, match=r"raise group_factor to at least"):
        distpm.halo_catalogue(particles, labels, COSMO, cfg, group_factor=1e-4)


def test_bad_settings_are_refused(run):
    with pytest.raises(ValueError, match="linking_length"):
        distpm.fof(run, CFG, linking_length=-1)
    with pytest.raises(ValueError, match="min_members"):
        distpm.fof(run, CFG, min_members=0)
    with pytest.raises(ValueError, match="expected"):
        distpm.fof_points(np.zeros((10, 3)), CFG)
    with pytest.raises(ValueError, match="twice the linking length"):
        distpm.fof_points(np.zeros((CFG.n_particles, 3)), CFG.on((8, 1)), linking_length=5)
    with pytest.raises(TypeError, match="fof_points"):
        distpm.fof(np.zeros((CFG.n_particles, 3)), CFG)


def test_gadget_catalogue_refuses_labels_from_another_catalogue(run, tmp_path):
    import dataclasses

    labels = distpm.fof(run, CFG)
    cat = distpm.halo_catalogue(run, labels, COSMO, CFG)
    fewer = dataclasses.replace(
        cat, **{f.name: getattr(cat, f.name)[1:] for f in dataclasses.fields(cat) if f.name != "a"}
    )
    lost = cat.n[0]
    with pytest.raises(ValueError, match=f"^{lost} particles carry labels that are not in the cat"):
        distpm.io.write_groups(tmp_path, run, labels, fewer, COSMO, CFG)
    assert not (tmp_path / "groups_000").exists()


def test_gadget_catalogue_without_groups(run, tmp_path):
    """No group: an empty catalogue, and the snapshot holds every particle in id order."""
    import h5py

    labels = distpm.fof(run, CFG, min_members=CFG.n_particles)
    cat = distpm.halo_catalogue(run, labels, COSMO, CFG)
    assert len(cat) == 0
    snapshot, groups = distpm.io.write_groups(tmp_path, run, labels, cat, COSMO, CFG, number=3)
    with h5py.File(f"{groups}.0.hdf5") as f:
        assert f["Header"].attrs["Ngroups_Total"] == f["Header"].attrs["Nids_Total"] == 0
        assert f["Group/GroupLen"].shape == (0,) and f["IDs/ID"].shape == (0,)
    with h5py.File(f"{snapshot}.0.hdf5") as f:
        ids = f["PartType1/ParticleIDs"][:]
    assert np.array_equal(ids, np.arange(1, CFG.n_particles + 1))


@pytest.mark.slow
def test_default_settings_run_on_a_64_cubed_pm_output_on_4x2():
    """FoF, the catalogue, kNN and the balanced Morton sort with every buffer at its default
    on the final particles of the default 64^3 run (256 Mpc/h), on a 4x2 grid."""
    cfg = distpm.SimConfig(mesh_shape=64, parallel=(4, 2))
    run = distpm.simulate(distpm.white_noise(0, cfg), COSMO, cfg)
    labels = distpm.fof(run, cfg)
    cat = distpm.halo_catalogue(run, labels, COSMO, cfg)
    mask = np.asarray(run.mask)
    labelled = np.asarray(labels)[mask][:, 0] >= 0
    assert len(cat) > 100 and cat.n.min() >= 20 and cat.n.sum() == labelled.sum()
    dist, ids = distpm.knn(run, 8, cfg)
    dist, ids = np.asarray(dist)[mask], np.asarray(ids)[mask]
    assert np.all(np.diff(dist, axis=1) >= 0) and np.all(dist[:, 0] > 0)
    assert np.all(ids >= 0) and np.isfinite(dist).all()
    ordered, keys = distpm.morton_sort(run, cfg, balance=True)
    held = np.asarray(ordered.mask).reshape(8, -1).sum(axis=1)
    assert held.max() - held.min() <= 1 and held.sum() == cfg.n_particles


def test_the_mass_function_plot_of_a_run_without_halos():
    """Particles at a = 0.1 form no halo of 20: the plot still has its axes and says so."""
    from distpm import plots

    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=16, parallel="1x1")
    state = distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg)
    cat = distpm.halo_catalogue(state, distpm.fof(state, cfg), COSMO, cfg)
    assert len(cat) == 0
    fig = plots.mass_function_plot(cat, COSMO, cfg, 20)
    assert "0 halos" in fig.axes[0].get_title() and len(fig.axes) == 2
