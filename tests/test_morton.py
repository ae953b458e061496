"""Morton keys against a bit-by-bit reference; the distributed sort keeps every particle."""

import jax
import numpy as np
import pytest

import distpm
from distpm.analysis import morton
from distpm.parallel import migrate
from distpm.parallel.decomposition import Decomposition
from distpm.shares import from_rows

BOX = 64.0
CFG = distpm.SimConfig(
    mesh_shape=16,
    box_size=BOX,
    n_steps=5,
    a_start=0.1,
    parallel={"exchange_factor": 0.3, "devices": (1, 1), "capacity_factor": 2.0},
)


def reference_keys(pos, bits):
    """63-bit Morton keys as Python ints: bit 3 l + 2 - axis is bit l of the axis' cell."""
    cells = np.clip(np.floor(np.mod(pos, BOX) / BOX * 2**bits), 0, 2**bits - 1).astype(int)
    keys = []
    for c in cells:
        key = 0
        for level in range(bits):
            for axis in range(3):
                key |= ((int(c[axis]) >> level) & 1) << (3 * level + 2 - axis)
        keys.append(key)
    return np.array(keys, dtype=object)


@pytest.mark.parametrize("bits", [21, 14, 7])  # 14: the kNN bounds' keys
def test_keys_interleave_the_cell_bits(bits):
    pos = np.random.default_rng(1).uniform(-BOX, 2 * BOX, (500, 3)).astype(np.float32)
    pos[:3] = [[0, 0, 0], [np.nextafter(np.float32(BOX), np.float32(0))] * 3, [BOX / 2, 0, 0]]
    words = np.asarray(distpm.morton_keys(pos, (BOX,) * 3, bits=bits)).astype(np.uint64)
    got = [int(h) << 32 | int(lo) for h, lo in words]
    assert got == list(reference_keys(pos, bits))
    assert got[1] == 2 ** (3 * bits) - 1 and got[2] == 1 << (3 * bits - 1)


@pytest.fixture(scope="module")
def run():
    return distpm.simulate(distpm.white_noise(4, CFG), distpm.Cosmology.planck18(), CFG)


def _on_grid(run, cfg):
    """The run's particles on another grid (read in id order, then sent to their owners)."""
    pos, vel, ids = (run.by_id(f) for f in ("pos", "vel", "ids"))
    return from_rows(
        lambda a, b: {"pos": pos[a:b], "vel": vel[a:b], "ids": ids[a:b]}, len(ids), 0.5, cfg
    )


@pytest.mark.parametrize("devices", [(1, 1), (4, 2), (2, 4)])
@pytest.mark.parametrize("balance", [False, True])
def test_sort_orders_all_devices_and_keeps_every_particle(run, devices, balance):
    cfg = CFG.on(devices)
    particles = _on_grid(run, cfg) if devices != (1, 1) else run
    out, keys = distpm.morton_sort(particles, cfg, balance=balance)
    mask = np.asarray(out.mask)
    words = np.asarray(keys)[mask].astype(np.uint64)
    flat = words[:, 0] << np.uint64(32) | words[:, 1]
    assert np.all(flat[1:] >= flat[:-1])  # device after device, slot after slot
    np.testing.assert_array_equal(
        words, np.asarray(distpm.morton_keys(out.pos, cfg.box_size))[mask]
    )
    for field in ("pos", "vel"):
        np.testing.assert_array_equal(out.by_id(field), particles.by_id(field))
    assert out.count == CFG.n_particles
    counts = mask.reshape(Decomposition.of(cfg).n_devices, -1).sum(axis=1)
    n, p = CFG.n_particles, Decomposition.of(cfg).n_devices
    if balance:
        assert list(counts) == [(d + 1) * n // p - d * n // p for d in range(p)]
    else:
        assert counts.max() < 1.5 * n / p  # the sampled splitters are close to even


def _counting_tries(monkeypatch, module):
    """The (bucket, room, needs) of every run of ``module``'s grown buffers."""
    grown, tries = migrate.grown, []

    def counted(once, cfg, bucket, room):
        def run_once(bucket, room):
            result, needs = once(bucket, room)
            tries.append((bucket, room, jax.device_get(needs)))
            return result, needs

        return grown(run_once, cfg, bucket, room)

    monkeypatch.setattr(module, "grown", counted)
    return tries


def test_a_sort_whose_first_buckets_overflow_runs_once_more(run, monkeypatch):
    """On 4x2 a Morton sort sends nearly all of a device's particles to one other in its
    first stage, beyond the first buckets. The needs it reports are its exchange's had
    nothing overflowed (every device's count per destination), so the retry fits: two runs
    (the stages' own counts, which understate the second stage's, took four). Those needs
    equal what the stages count when the buckets hold everything."""
    cfg = CFG.on((4, 2))
    particles = _on_grid(run, cfg)
    tries = _counting_tries(monkeypatch, morton.migrate)
    distpm.morton_sort(particles, cfg)
    assert len(tries) == 2 and tries[0][2]["exchange"] > tries[0][0], tries
    needs = tries[0][2]

    # the stages' own counts with room for everything: the same needs
    monkeypatch.setattr(morton.migrate, "route_needs", lambda *args: {})
    keys = morton._morton_keys(particles.pos, tuple(cfg.box_size), 21)
    room = 4 * Decomposition.of(cfg).capacity
    *_, counted_needs = morton._sort(particles, keys, cfg, room, room, None, True)
    for name in ("exchange", "capacity"):
        assert int(counted_needs[name]) == int(needs[name]), (name, counted_needs, needs)


def test_particles_read_in_any_order_reach_their_owners_in_two_runs(run, monkeypatch):
    """Particles read in a shuffled order onto 2x2 (every device sends to every other, far
    beyond its buckets): redistributed in two runs of the exchange, as the sort above (it
    took three), with every particle at its owner."""
    from distpm import shares

    cfg = CFG.on((2, 2))
    pos, vel, ids = (run.by_id(f) for f in ("pos", "vel", "ids"))
    order = np.random.default_rng(0).permutation(len(ids))
    tries = _counting_tries(monkeypatch, shares.parallel_migrate)
    rows = lambda a, b: {"pos": pos[order[a:b]], "vel": vel[order[a:b]], "ids": ids[order[a:b]]}  # noqa: E731
    particles = from_rows(rows, len(ids), 0.5, cfg)
    assert len(tries) == 2 and tries[0][2]["exchange"] > tries[0][0], tries
    assert particles.count == CFG.n_particles
    np.testing.assert_array_equal(particles.by_id("pos"), pos)
    at_owners = distpm.density(particles, cfg, migrate=False)  # raises for a particle elsewhere
    np.testing.assert_allclose(np.asarray(at_owners), np.asarray(distpm.density(run, CFG)),
                               atol=1e-5)  # fmt: skip


def test_sorted_particles_still_simulate_and_analyse(run):
    """Sorted particles leave their blocks: density sends them home and gives the same field
    (most particles move, which needs exchange buffers as large as a device's share)."""
    cfg = CFG.on((4, 2), exchange_factor=1.0)
    particles = _on_grid(run, cfg)
    out, _ = distpm.morton_sort(particles, cfg, balance=True)
    np.testing.assert_allclose(
        np.asarray(distpm.density(out, cfg)), np.asarray(distpm.density(particles, cfg)), atol=1e-5
    )


def test_splitters_are_even_for_particles_in_lattice_order():
    """Slots in lattice order (initial conditions, files read in id order): the splitters'
    samples must not follow the lattice (every 32nd slot of a 16 x 16 x 32 block has the
    same z), or some devices get several times their share."""
    shape, box = (64, 32, 32), (2 * BOX, BOX, BOX)
    cfg = distpm.SimConfig(
        mesh_shape=shape, box_size=box, parallel={"devices": (4, 2), "capacity_factor": 2.0}
    )
    q = (np.indices(shape).reshape(3, -1).T + 0.5) * (BOX / 32)
    pos = q + np.random.default_rng(3).normal(0, 0.1 * BOX / 32, q.shape)
    particles = distpm.shares.from_positions(pos.astype(np.float32), cfg)
    out, _ = distpm.morton_sort(particles, cfg)
    counts = np.asarray(out.mask).reshape(Decomposition.of(cfg).n_devices, -1).sum(axis=1)
    assert counts.sum() == cfg.n_particles
    assert counts.max() < 1.1 * cfg.n_particles / Decomposition.of(cfg).n_devices, counts
