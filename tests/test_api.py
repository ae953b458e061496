"""Every public function that takes arrays works under jit, grad and jit(grad),
on one device and on a 2x2 grid, with the same values everywhere.

Each case is a scalar loss of the white noise (or of a particle state) that
goes through one public function. "The same" is 1e-5 of the largest
element, for the noise gradient and for the cosmology gradient as a vector,
as in the other distributed tests. Losses reduce over the valid particles
with order-independent sums, so that they do not depend on which device
holds which particle. Gradients with respect to particle states are
compared particle by particle (by id).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import distpm
from distpm.parallel import Layout
from distpm.state import lagrangian_block

COSMO = distpm.Cosmology.planck18()
# arbitrary positions may all change device: exchange_factor 1 always suffices
BASE = distpm.SimConfig(
    box_size=64.0,
    mesh_shape=8,
    n_steps=1,
    parallel={"capacity_factor": 2.0, "exchange_factor": 1.0},
)
SNAPSHOTS = dict(n_steps=2, snapshots=(0.5,))
GRIDS = ("1x1", "2x2")


def _reduce(state, cfg):
    """An order-independent scalar of a particle state: sum over valid slots."""
    k = 2 * np.pi / cfg.box_size[0]
    per = jnp.sin(k * state.pos[:, 0]) * jnp.cos(k * state.pos[:, 1]) + 0.1 * state.vel[:, 2] ** 2
    return jnp.sum(jnp.where(state.mask, per, 0.0))


def _positions(noise, cfg):
    """(N, 3) positions [Mpc/h] differentiable in the noise: a lattice, displaced."""
    q, _ = lagrangian_block(cfg, Layout(cfg.particle_shape), noise.dtype)
    shift = jnp.stack([noise.reshape(-1), -noise.reshape(-1), 0.5 * noise.reshape(-1)], -1)
    return jnp.mod(q + 2.0 * shift, cfg.box_size[0])


def _field(noise, cfg):
    """A smooth density-like field on the mesh from the noise (mesh = particle grid here)."""
    return jnp.tanh(noise)


CASES = {
    "initial_conditions": lambda x, c, cfg: _reduce(distpm.initial_conditions(x, c, cfg), cfg),
    "simulate": lambda x, c, cfg: _reduce(distpm.simulate(x, c, cfg), cfg),
    "simulate_snapshots": lambda x, c, cfg: sum(
        (i + 1) * _reduce(s, cfg)
        for i, s in enumerate(distpm.simulate_snapshots(x, c, cfg.replace(**SNAPSHOTS)))
    ),
    "density_of_particles": lambda x, c, cfg: jnp.sum(
        distpm.density(distpm.simulate(x, c, cfg), cfg) ** 2
    ),
    "density_of_positions": lambda x, c, cfg: jnp.sum(distpm.density(_positions(x, cfg), cfg) ** 2),
    "power_spectrum": lambda x, c, cfg: jnp.sum(
        distpm.power_spectrum(_field(x, cfg), cfg)[1] * c.sigma8
    ),
    "power_spectrum_cross": lambda x, c, cfg: jnp.sum(
        distpm.power_spectrum(_field(x, cfg), cfg, other=jnp.sin(x) * c.Omega_c)[1]
    ),
}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _all_modes(loss, noise, cfg):
    """(value, jit value, grad, jit grad) of loss(noise, cosmo), grads w.r.t. (noise, cosmo):
    value and gradient as one call, once as it is and once under jit (one compile each)."""
    f = jax.value_and_grad(lambda x, c: loss(x, c, cfg), argnums=(0, 1))
    value, g_eager = f(noise, COSMO)
    value_jit, g_jit = jax.jit(f)(noise, COSMO)
    return value, value_jit, g_eager, g_jit


def _flat_grad(g):
    g_noise, g_cosmo = g
    return np.asarray(g_noise), np.array([float(v) for v in jax.tree.leaves(g_cosmo)])


@pytest.mark.parametrize("name", list(CASES))
def test_public_function_under_jit_and_grad_on_one_device_and_a_grid(name):
    results = {}
    for grid in GRIDS:
        cfg = BASE.on(grid)
        noise = distpm.white_noise(0, cfg)
        value, value_jit, g, g_jit = _all_modes(CASES[name], noise, cfg)
        assert _rel(value_jit, value) < 1e-5, (grid, value, value_jit)
        for a, b in zip(_flat_grad(g_jit), _flat_grad(g), strict=True):
            assert _rel(a, b) < 1e-5, grid
        g_noise, g_cosmo = _flat_grad(g)
        assert np.all(np.isfinite(g_noise)) and np.any(g_noise != 0), grid
        results[grid] = (float(value), g_noise, g_cosmo)
    (v1, n1, c1), (v2, n2, c2) = results["1x1"], results["2x2"]
    assert abs(v2 - v1) <= 1e-5 * abs(v1), (v1, v2)
    assert _rel(n2, n1) < 1e-5
    # the cosmology gradient as one vector (float32 sums over devices in another order)
    assert _rel(c2, c1) < 1e-5, (c1, c2)


def test_evolve_gradient_with_respect_to_the_state_is_the_same_per_particle():
    """grad of an evolved state with respect to the input state, matched by id across grids."""
    per_id = {}
    for grid in GRIDS:
        cfg = BASE.on(grid)
        state = distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg)

        def loss(state, cosmo, cfg=cfg):
            return _reduce(distpm.evolve(state, cosmo, cfg)[-1], cfg)

        grad = jax.grad(loss, argnums=(0, 1), allow_int=True)  # ids and mask: no gradient
        g_state, _ = grad(state, COSMO)
        g_state_jit, _ = jax.jit(grad)(state, COSMO)
        assert abs(float(jax.jit(loss)(state, COSMO)) - float(loss(state, COSMO))) < 1e-5 * abs(
            float(loss(state, COSMO))
        )
        mask, ids = np.asarray(state.mask), np.asarray(state.ids)
        order = np.lexsort((ids[mask][:, 1], ids[mask][:, 0]))
        for field in ("pos", "vel"):
            eager = np.asarray(getattr(g_state, field))[mask][order]
            jitted = np.asarray(getattr(g_state_jit, field))[mask][order]
            assert _rel(jitted, eager) < 1e-5, (grid, field)
            assert np.any(eager != 0)
            per_id[grid, field] = eager
    for field in ("pos", "vel"):
        assert _rel(per_id["2x2", field], per_id["1x1", field]) < 1e-5, field


def test_density_of_a_run_buffer_says_to_pass_the_particles():
    cfg = BASE.on("2x2")
    final = distpm.simulate(distpm.white_noise(0, cfg), COSMO, cfg)
    with pytest.raises(ValueError, match="pass the Particles themselves"):
        distpm.density(final.pos, cfg)


def test_bad_noise_and_cosmology_are_refused_where_their_values_can_be_read():
    cfg = BASE.on("1x1")
    noise = distpm.white_noise(0, cfg)
    with pytest.raises(ValueError, match="noise holds NaN or inf"):
        distpm.simulate(noise.at[1, 2, 3].set(jnp.nan), COSMO, cfg)
    with pytest.raises(
        ValueError, match=r"unphysical cosmology \(need Omega_c >= 0, 0 < Omega_m <= 1\)"
    ):
        distpm.simulate(noise, COSMO.replace(Omega_c=-0.1), cfg)
    state = distpm.initial_conditions(noise, COSMO, cfg)
    with pytest.raises(ValueError, match=r"need h > 0"):
        distpm.evolve(state, COSMO.replace(h=0.0), cfg)
    # traced values cannot be read: under jit the same cosmology runs (and gives NaN) ...
    bad = COSMO.replace(Omega_c=-0.1)
    loss = jax.jit(lambda c: jnp.sum(distpm.simulate(noise, c, cfg).pos))
    assert jnp.isfinite(loss(COSMO)) and not jnp.isfinite(loss(bad))
    # ... but values a jitted function closes over are concrete, and are read
    with pytest.raises(ValueError, match="unphysical cosmology"):
        jax.jit(lambda: distpm.simulate(noise, bad, cfg).pos)()
