"""Particle ids and global slots past 2^31, in jax's default 32-bit mode.

Ids are two int32 words (i, j * Nz + l); the Lagrangian index
(i * Ny + j) * Nz + l is formed on the host as int64. Global slots are
(device, slot) pairs. These tests drive the wide arithmetic with synthetic
indices of a 2^40-particle grid and with a small run whose ids are moved
past 2^31.
"""

import jax.numpy as jnp
import numpy as np

import distpm
from distpm.state import Particles, id_words, linear_ids

COSMO = distpm.Cosmology.planck18()
HUGE = (2**12, 2**14, 2**14)  # 2^40 particles


def test_id_words_give_the_lagrangian_index_past_2_to_the_31():
    rng = np.random.default_rng(0)
    index = [rng.integers(0, n, 1000) for n in HUGE]
    index[0][:3] = [0, HUGE[0] - 1, 2**11]  # both ends of the grid and its middle
    index[1][:3] = [0, HUGE[1] - 1, 5]
    index[2][:3] = [0, HUGE[2] - 1, 7]
    words = id_words(*(jnp.asarray(i, jnp.int32) for i in index), HUGE)
    assert words.dtype == jnp.int32
    exact = [(int(i) * HUGE[1] + int(j)) * HUGE[2] + int(k) for i, j, k in zip(*index, strict=True)]
    ids = linear_ids(np.asarray(words), HUGE)
    np.testing.assert_array_equal(ids, np.asarray(exact, dtype=np.int64))
    assert ids.max() > 2**39 and ids[1] == 2**40 - 1
    assert linear_ids(np.asarray([[-1, -1], [1, 2]]), HUGE).tolist() == [-1, 2**28 + 2]
    # the pairs sort like the index itself (what by_id and FoF labels rely on)
    words = np.asarray(words)
    np.testing.assert_array_equal(
        np.lexsort((words[:, 1], words[:, 0])), np.argsort(ids, kind="stable")
    )


def test_by_id_orders_wide_ids():
    rng = np.random.default_rng(1)
    ids = np.stack([rng.integers(2**20, 2**31 - 1, 64), rng.integers(0, 2**28, 64)], 1)
    pos = rng.uniform(0, 1, (64, 3)).astype(np.float32)
    mask = np.ones(64, bool)
    mask[::7] = False  # invalid slots are left out
    state = Particles(
        pos=jnp.asarray(pos), vel=jnp.zeros((64, 3)),
        ids=jnp.asarray(ids, jnp.int32), mask=jnp.asarray(mask), a=jnp.asarray(1.0),
    )  # fmt: skip
    wide = linear_ids(ids, (2**31 - 1, 2**14, 2**14))
    order = np.argsort(wide[mask])
    np.testing.assert_array_equal(state.by_id("pos"), pos[mask][order])
    assert state.count == int(mask.sum())


def test_ids_past_2_to_the_31_travel_with_their_particles_on_a_grid():
    """A run on 2x2 whose ids are shifted past 2^31 (hi word + 2^23 + 1 on a 16 x 16 plane):
    every id arrives once, unchanged, and by_id lines the particles up with
    the same run on one device."""
    finals = {}
    for grid in ("1x1", "2x2"):
        cfg = distpm.SimConfig(
            mesh_shape=16,
            box_size=64.0,
            n_steps=3,
            parallel={"devices": grid, "exchange_factor": 0.25},
        )
        state = distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg)
        offset = jnp.asarray([2**23 + 1, 0], jnp.int32)
        shifted = state.replace(ids=jnp.where(state.mask[:, None], state.ids + offset, 0))
        final = distpm.evolve(shifted, COSMO, cfg)[-1]
        ids = linear_ids(final.by_id("ids"), cfg.particle_shape)
        start = (2**23 + 1) * 16 * 16
        assert start > 2**31
        np.testing.assert_array_equal(ids, start + np.arange(cfg.n_particles, dtype=np.int64))
        finals[grid] = final.by_id("pos")
    assert np.max(np.abs(finals["2x2"] - finals["1x1"])) < 1e-3
