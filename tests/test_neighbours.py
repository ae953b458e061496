"""Exact k nearest neighbours against scipy's cKDTree (periodic), on one device and a grid."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial import cKDTree

import distpm
from distpm.analysis import bounds, knn_answers, knn_cells, neighbours
from distpm.parallel.decomposition import Decomposition
from distpm.state import linear_ids

BOX = 64.0
CFG = distpm.SimConfig(
    mesh_shape=32,
    box_size=BOX,
    n_steps=10,
    a_start=0.1,
    parallel={"exchange_factor": 0.5, "capacity_factor": 2.0, "devices": (1, 1)},
)
K = 8


@pytest.fixture(scope="module")
def points():
    """Clustered (a 32^3 PM run, 2 Mpc/h per particle) and uniform float32 positions."""
    run = distpm.simulate(distpm.white_noise(0, CFG), distpm.Cosmology.planck18(), CFG)
    uniform = np.random.default_rng(5).uniform(0, BOX, (CFG.n_particles, 3)).astype(np.float32)
    return {"clustered": run.by_id("pos"), "uniform": uniform}


def reference(pos, k=K):
    """cKDTree's k nearest other points (periodic, float64 of the float32 positions)."""
    x = np.mod(pos.astype(np.float64), BOX)
    dist, index = cKDTree(x, boxsize=BOX).query(x, k + 1)
    return dist[:, 1:], index[:, 1:]


def assert_same_neighbours(dist, index, want_dist, want_index):
    np.testing.assert_allclose(dist, want_dist, rtol=1e-6)
    differ = index != want_index
    assert differ.mean() < 1e-3  # only at ties, which float32 may order either way
    rows, cols = np.nonzero(differ)
    np.testing.assert_allclose(dist[rows, cols], want_dist[rows, cols], rtol=1e-6)


@pytest.mark.parametrize("kind", ["clustered", "uniform"])
@pytest.mark.parametrize("devices", [(1, 1), (4, 2)])
def test_distances_and_neighbours_equal_ckdtree(points, kind, devices):
    pos = points[kind]
    dist, index = distpm.knn_points(pos, K, CFG.on(devices))
    assert_same_neighbours(dist, index, *reference(pos))


def test_more_neighbours_than_the_bounds_window(points):
    """k > bounds._WINDOW: no bounds (inf), every particle sweeps the passes until answered."""
    pos = points["clustered"]
    k = bounds._WINDOW + 4
    bound2 = bounds.kth_bound2(jnp.asarray(pos), jnp.ones(len(pos), bool), (BOX,) * 3, k)
    assert np.all(np.isinf(np.asarray(bound2)))
    dist, index = distpm.knn_points(pos, k, CFG)
    assert_same_neighbours(dist, index, *reference(pos, k))


def test_particles_of_a_run_on_a_grid(points):
    """Particles in, id words out, on 2x4; self excluded; sorted by distance."""
    cfg = CFG.on((2, 4))
    pos = points["clustered"]
    _, ny, nz = cfg.particle_shape
    rows = np.arange(len(pos))
    ids = np.stack([rows // (ny * nz), rows % (ny * nz)], axis=1)
    vel = np.random.default_rng(1).normal(size=pos.shape).astype(np.float32)
    particles = distpm.shares.from_rows(
        lambda a, b: {"pos": pos[a:b], "vel": vel[a:b], "ids": ids[a:b]}, len(pos), 1.0, cfg
    )
    dist, words = distpm.knn(particles, K, cfg)
    mask = np.asarray(particles.mask)
    order = np.argsort(linear_ids(np.asarray(particles.ids)[mask], cfg.particle_shape))
    dist = np.asarray(dist)[mask][order]
    index = linear_ids(np.asarray(words)[mask][order], cfg.particle_shape)
    assert np.all(np.diff(dist, axis=1) >= 0)
    want_dist, want_index = reference(pos)
    assert_same_neighbours(dist, index, want_dist, want_index)

    # reductions made as the neighbours are found: the lists never exist
    kth, mean, mean_vel = (
        np.asarray(x)[mask][order] for x in distpm.knn(particles, K, cfg, reduce=_three)
    )
    np.testing.assert_allclose(kth, want_dist[:, -1], rtol=1e-6)
    np.testing.assert_allclose(mean, want_dist.mean(axis=1), rtol=1e-6)
    same = np.all(index == want_index, axis=1)  # all but rows with ties, listed either way
    assert same.mean() > 0.99
    np.testing.assert_allclose(mean_vel[same], vel[want_index[same]].mean(axis=1), atol=1e-6)


def _three(dist, ids, vel):
    return (
        knn_answers.kth_distance(dist, ids, vel),
        knn_answers.mean_distance(dist, ids, vel),
        knn_answers.mean_velocity(dist, ids, vel),
    )


def test_many_blocks_of_rows_per_pass(points, monkeypatch):
    """Blocks of 1024-1820 rows (by default 2621-7281 here: 2 column ranges per slot): each
    pass's rows go through many blocks, on two devices."""
    monkeypatch.setattr(neighbours, "_RANGES", 2**14)
    pos = points["clustered"]
    cfg = CFG.on((2, 1), capacity_factor=2.5)  # a program of its own
    dist, index = distpm.knn_points(pos, K, cfg)
    assert_same_neighbours(dist, index, *reference(pos))


def test_reduce_runs_where_the_neighbours_are(points):
    """knn_points with a reduction: per-row results, in the input's row order, equal to
    cKDTree's (the program of test_particles_of_a_run_on_a_grid; positions alone have zero
    velocities)."""
    pos = points["clustered"]
    kth, mean, mean_vel = distpm.knn_points(pos, K, CFG.on((2, 4)), reduce=_three)
    want_dist, _ = reference(pos)
    assert kth.shape == mean.shape == (CFG.n_particles,)
    np.testing.assert_allclose(kth, want_dist[:, -1], rtol=1e-6)
    np.testing.assert_allclose(mean, want_dist.mean(axis=1), rtol=1e-6)
    assert mean_vel.shape == (CFG.n_particles, 3) and not np.any(mean_vel)


def test_bad_input_and_small_radius_raise(points, monkeypatch):
    pos = points["uniform"]
    with pytest.raises(ValueError, match="k must be an integer"):
        distpm.knn_points(pos, 0, CFG)
    with pytest.raises(TypeError, match="knn_points"):
        distpm.knn(pos, K, CFG)
    with pytest.raises(ValueError, match="ghost_factor must be > 0"):
        distpm.knn_points(pos, K, CFG, ghost_factor=0.0)
    with pytest.raises(ValueError, match="fewer than k = 8 neighbours within"):
        distpm.knn_points(pos, K, CFG, max_radius=1.0)
    with pytest.raises(distpm.CapacityError, match="raise ghost_factor to at least"):
        distpm.knn_points(pos, K, CFG.on((4, 2)), ghost_factor=0.01)
    # a pass's candidates are numbered in int32; the check's margin is 2 chunks, so that
    # with chunks of 2^30 any count is too many: the count reaches the caller, which raises
    monkeypatch.setattr(neighbours, "_CHUNK", 2**30)
    with pytest.raises(distpm.CapacityError, match="more than int32 numbers"):
        distpm.knn_points(pos, K, CFG)


def test_the_ghost_factor_asked_for_is_the_smallest_that_holds_every_face():
    """A ghost overflow asks for the smallest factor (to 0.01) whose slots hold what every
    face of every grid had to send."""
    cfg = CFG.on((4, 2))
    steps = knn_cells.radii(cfg, K, None)
    ghost_radii = [group[-1] for group in knn_cells.groups(steps)]
    rng = np.random.default_rng(3)

    def fits(factor, needed):
        sizes = [knn_cells.ghost_sizes(cfg, r, factor) for r in ghost_radii]
        return (np.asarray(sizes) >= needed).all()

    for start in (2.0, 2.0, 2.0, 2.005, 0.37):  # faces beyond its slots, by up to 3 times
        sizes = np.array([knn_cells.ghost_sizes(cfg, r, start) for r in ghost_radii])
        most = np.array([knn_cells.ghost_sizes(cfg, r, 1e9) for r in ghost_radii])  # all nodes
        needed = np.minimum(np.floor(sizes * rng.uniform(0.2, 3.0, sizes.shape)), most)
        assert not fits(start, needed)
        factor = knn_cells.ghost_factor_for(cfg, ghost_radii, needed, start)
        assert factor > start
        assert fits(factor, needed) and not fits((round(factor * 100) - 1) / 100, needed)


@pytest.mark.parametrize(
    "longest, dtype", [(3, "float32"), (60, "float32"), (200, "float32"), (60, "float64")]
)  # runs up to 32 are ranked in place, longer ones sorted (float32: sorting.argsort)
def test_merge_keeps_the_k_nearest_of_each_row(longest, dtype, request):
    """The merge of candidate runs (ranked in place for short runs, sorted for long ones)
    against numpy: each row's k nearest of what it had and what it is offered."""
    import jax.numpy as jnp

    if dtype == "float64":
        request.getfixturevalue("x64")

    from distpm.analysis.neighbours import _merge

    rng = np.random.default_rng(longest)
    cap, k, m = 50, 4, 600
    runs = rng.integers(1, longest + 1, cap)
    first_row = 7  # the slice's first row has candidates from before
    rows = np.repeat(np.arange(first_row, cap), runs[first_row:])[:m]
    rows = np.concatenate([rows, np.full(m - len(rows), cap)]).astype(np.int32)  # unused: cap
    d2 = rng.random(m).astype(dtype)
    d2[rows == cap] = np.inf
    ident = np.stack([rows, np.arange(m)], axis=1).astype(np.int32)
    best_d2 = np.full((cap + 1, k), np.inf, dtype)  # and the spare row
    best_id = np.full((cap + 1, k, 2), -1, np.int32)
    best_d2[first_row, :2] = [0.1, 0.5]  # what it had: two neighbours
    best_id[first_row, :2] = [[first_row, -2], [first_row, -3]]
    got_d2, got_id = _merge(*map(jnp.asarray, (best_d2, best_id, rows, d2, ident)), k)
    for r in range(cap):
        had = [(best_d2[r, j], tuple(best_id[r, j])) for j in range(k) if best_d2[r, j] < np.inf]
        offered = [(d2[i], tuple(ident[i])) for i in np.nonzero(rows == r)[0]]
        want = sorted(had + offered)[:k]
        want += [(np.inf, (-1, -1))] * (k - len(want))
        np.testing.assert_array_equal(np.asarray(got_d2[r]), [w[0] for w in want])
        np.testing.assert_array_equal(np.asarray(got_id[r]), [w[1] for w in want])


def test_a_thin_box_whose_cells_would_reach_across_it():
    """256 particles in clumps on the x faces of a 4 x 4 x 4000 Mpc/h box: the cell table
    (at most 8 entries a node) would take columns 7.5 Mpc/h wide, wider than the 6 Mpc/h
    frame, where each row listed other particles twice (every row was wrong, by up to 82% in
    distance; without the id check of aa4d76a, its own copy too). The columns stop short of
    the box minus twice the ball; where no cells can (a box 10^5 times longer than wide), the
    kNN says so."""
    box = (4.0, 4.0, 4000.0)
    cfg = distpm.SimConfig(mesh_shape=(2, 2, 64), box_size=box, parallel=(1, 1))
    sides = knn_cells.cells((6.0, 6.0, 4002.0), 1.0, 640, knn_cells.widest(cfg, 1.0))[0]
    assert max(sides[:2]) < box[0] - 2 * knn_cells.margin(cfg, 1.0) < 2.0
    with pytest.raises(ValueError, match="too elongated"):
        knn_cells.cells((2.0, 2.0, 131042.0), 0.5, 2432, (7.1e-5, 7.1e-5, 1e5))
    rng = np.random.default_rng(0)
    centres = np.stack([np.zeros(16), np.full(16, 2.0), np.arange(16) * 250.0 + 10], 1)
    pos = np.repeat(centres, cfg.n_particles // 16, axis=0) + rng.normal(0, 0.1, (256, 3))
    pos = np.mod(pos, box).astype(np.float32)
    dist, index = distpm.knn_points(pos, K, cfg, ghost_factor=8.0)
    want_dist, want_index = cKDTree(pos.astype(np.float64), boxsize=box).query(pos, K + 1)
    np.testing.assert_array_equal(index, want_index[:, 1:])
    np.testing.assert_allclose(dist, want_dist[:, 1:], rtol=1e-5)


def test_a_tight_clump_whose_chunks_keep_nearly_every_candidate():
    """All points within the first radius of each other, on a buffer that the merge slices
    do not divide (5175 slots, slices of 1293): chunks in which nearly every candidate is
    kept, so the last slice reaches past the kept ones (a row once listed itself there)."""
    cfg = distpm.SimConfig(mesh_shape=(15, 15, 23), box_size=(15.0, 15.0, 23.0), parallel=(1, 1))
    pos = (5.0 + 0.05 * np.random.default_rng(0).random((cfg.n_particles, 3))).astype(np.float32)
    dist, index = distpm.knn_points(pos, K, cfg)
    box = np.asarray(cfg.box_size)
    want_dist, want_index = cKDTree(pos.astype(np.float64), boxsize=box).query(pos, K + 1)
    assert np.all(index != np.arange(len(pos))[:, None])
    np.testing.assert_allclose(dist, want_dist[:, 1:], rtol=1e-5)
    np.testing.assert_array_equal(index, want_index[:, 1:])


@pytest.mark.parametrize("side", [1.4, 0.7, 0.45])
def test_ball_ranges_hold_every_node_within_the_radius(side):
    """The z cells that ball_columns keeps in each of the columns (9 as wide as the radius,
    25 half as wide, 49 a third) hold every node within the radius (brute force), empty
    slots and edge cells included, each node once, and none of a column past the frame."""
    import jax.numpy as jnp

    from distpm.analysis import links

    rng = np.random.default_rng(7)
    n, radius = 3000, 1.3
    rel = rng.uniform(0, 10.0, (n, 3)).astype(np.float32)
    rel[:300] = 5 + rng.normal(0, 0.3, (300, 3))  # a clump: long columns
    valid = rng.random(n) < 0.9
    sides = (side, side, side / 4)  # columns a little wider than the radius (or narrower)
    n_cells = tuple(int(np.ceil(10.0 / s)) for s in sides)
    order, cells = links.sort_by_cell(jnp.asarray(rel), jnp.asarray(valid), sides, n_cells)
    order = np.asarray(order)
    valid_s = jnp.asarray(valid[order])
    own = np.argsort(order)  # each node's place in the sorted order
    columns = links.ball_columns(jnp.asarray(rel), cells[own], sides, radius, n_cells)
    table = links.cell_starts(cells, valid_s, n_cells)
    starts, lengths = links.spans_from_table(table, columns, n_cells, jnp.asarray(valid))
    starts, lengths = np.asarray(starts), np.asarray(lengths)
    assert not lengths[~valid].any()
    cells_s, reach = np.asarray(cells), links.column_reach(radius, sides)
    d2 = np.sum((rel[:, None] - rel[None]) ** 2, axis=-1)
    examined = 0
    for i in np.flatnonzero(valid):
        ranges = zip(starts[i], lengths[i], strict=True)
        listed = np.concatenate([np.arange(s, s + m) for s, m in ranges])
        assert len(set(listed)) == len(listed)  # no node twice
        offset = np.abs(cells_s[listed, :2] - cells_s[own[i], :2])
        assert (offset <= reach).all()  # only the row's columns, none aliased from elsewhere
        near = own[np.flatnonzero(valid & (d2[i] <= radius**2))]
        assert np.isin(near, listed).all()
        examined += len(listed)
    # against the 27 cells of side 1.4 around each node (1.0 untrimmed): 12.5 of 27 radius^3
    # in theory, plus the z cells cut at their edges: 0.57 here; 25 half as wide columns,
    # 0.41; 49 a third as wide, 0.36
    coarse = np.floor(rel / 1.4).astype(int)
    stencil = valid & (np.abs(coarse[:, None] - coarse[None]).max(axis=-1) <= 1)
    assert examined < {1.4: 0.6, 0.7: 0.45, 0.45: 0.4}[side] * np.sum(stencil[valid])


@pytest.mark.parametrize("kind", ["clustered", "uniform"])
def test_bounds_hold_and_are_near_the_kth_distance(points, kind):
    """Every bound is at least the k-th neighbour distance among the valid slots; empty slots
    hold positions next to valid ones, which would shrink the bounds were they counted."""
    pos = np.mod(points[kind], BOX)
    n = len(pos)
    fake = np.mod(pos[: n // 4] + np.float32(1e-3), BOX)
    slots = np.concatenate([pos, fake]).astype(np.float32)
    order = np.random.default_rng(4).permutation(len(slots))  # empty slots among the others
    mask = np.arange(len(slots))[order] < n
    bound2 = bounds.kth_bound2(jnp.asarray(slots[order]), jnp.asarray(mask), (BOX,) * 3, K)
    got = np.sqrt(np.asarray(bound2))[mask]
    kth = reference(slots[order][mask])[0][:, -1]
    assert np.all(got >= kth * (1 - 1e-6))
    volume = (got / kth) ** 3  # measured: 1.56 (clustered), 1.68 (uniform); first order alone 3.6
    assert np.mean(volume) < 2.0


@pytest.mark.parametrize("n", [5, 17, 40])
def test_bounds_of_buffers_smaller_than_the_window(n):
    """Fewer slots than the window: each other particle is counted once, never the particle
    itself; with fewer than k others in the window there is no bound (inf)."""
    pos = np.random.default_rng(n).uniform(0, BOX, (n, 3)).astype(np.float32)
    got = np.sqrt(np.asarray(bounds.kth_bound2(jnp.asarray(pos), jnp.ones(n, bool), (BOX,) * 3, K)))
    if n < 2 * K + 1:  # a window of (n - 1) // 2 places on each side: fewer than k
        assert np.all(np.isinf(got))
    else:
        kth = reference(pos)[0][:, -1]
        assert np.all(np.isfinite(got)) and np.all(got >= kth * (1 - 1e-6))
    if n == 2 * K + 1:  # the window holds every other particle: the bound is the distance
        np.testing.assert_allclose(got, kth, rtol=1e-6)


@pytest.mark.parametrize(
    "mesh, box, devices, wraps",
    [
        (128, (256.0,) * 3, (1, 1), (True, True)),  # the benchmark's: no ghosts along x, y
        (32, (BOX,) * 3, (2, 1), (False, True)),  # split along x: ghosts there
        ((8, 32, 32), (8.0, 64.0, 64.0), (1, 1), (True, True)),  # the widest grid: (False, True)
        ((2, 2, 64), (4.0, 4.0, 4000.0), (1, 1), (False, False)),  # the thin box below
    ],
)
def test_cells_wrap_around_the_box_only_where_every_column_listed_is_distinct(
    mesh, box, devices, wraps
):
    """A grid wraps its cells around the box along x and y only on an axis of one device,
    and only where the columns a row lists along it (2 reach + 1 for its largest ball) are
    no more than the cells there, in a table of as many nodes as the grid holds: else a
    column would be listed twice, its nodes counted twice among a row's nearest."""
    cfg = distpm.SimConfig(mesh_shape=mesh, box_size=box, parallel=devices)
    groups = knn_cells.groups(knn_cells.radii(cfg, K, None), cfg)
    assert knn_cells.wraps(cfg, groups[0])[:2] == wraps
    for group in groups:
        wrap = knn_cells.wraps(cfg, group)
        assert not wrap[2] and all(
            p == 1 for p, w in zip(Decomposition.of(cfg).grid, wrap[:2], strict=True) if w
        )
        ball = knn_cells.margin(cfg, group[-1])
        for factor in (0.5, 2.0, 8.0):  # the node buffers: capacity and ghost slots
            sizes = knn_cells.ghost_sizes(cfg, group[-1], factor, wrap)
            n_nodes = Decomposition.of(cfg).capacity + 2 * sum(sizes)
            widths = neighbours.links.block_widths(cfg)
            extent = [w if wraps else w + 2 * ball for w, wraps in zip(widths, wrap, strict=True)]
            widest = knn_cells.widest(cfg, group[-1], wrap)
            sides, n_cells = knn_cells.cells(
                extent, knn_cells.margin(cfg, group[0]), n_nodes, widest, wrap
            )
            reach = neighbours.links.column_reach(ball, sides)
            for axis in (0, 1):
                if wrap[axis]:  # the cells tile the box
                    assert n_cells[axis] >= 2 * reach + 1
                    assert n_cells[axis] * sides[axis] == pytest.approx(box[axis], rel=1e-12)
                else:
                    assert sizes[axis] > 0


@pytest.mark.parametrize("margin", [np.float32(0.5), np.int64(1), 0.5, (0.0, 0.25, 0.5)])
def test_a_frame_takes_one_margin_or_one_per_axis(margin):
    """FoF gives one margin, a numpy scalar where the linking length is one (np.float32 is
    not a Python float); the kNN one per axis, 0 where its cells wrap."""
    from distpm.analysis import links
    from distpm.parallel.decomposition import Decomposition

    cfg = distpm.SimConfig(mesh_shape=8, box_size=16.0, parallel=(1, 1))
    _, to_frame = links.frame(cfg, Decomposition.of(cfg).mesh, margin)
    want = np.broadcast_to(np.asarray(margin, np.float32), 3)
    np.testing.assert_array_equal(np.asarray(to_frame(jnp.ones((2, 3)))), 1 + np.stack([want] * 2))
