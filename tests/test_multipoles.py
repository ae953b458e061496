"""Redshift-space multipoles: the estimator against numpy on a field of known anisotropic
power, and a run against Kaiser's linear prediction within the bins' cosmic variance."""

import jax.numpy as jnp
import numpy as np
import pytest

import distpm
from distpm.analysis.power import k_bin_edges, multipoles
from distpm.analysis.redshift import kaiser, radial_redshift_space, redshift_space
from distpm.background import E

COSMO = distpm.Cosmology.planck18()


def _modes(cfg, axis):
    """Per stored rfft mode: |k| [h/Mpc], mu along ``axis``, Hermitian weight."""
    n, box = cfg.mesh_shape, cfg.box_size
    kx, ky = (2 * np.pi * np.fft.fftfreq(m, b / m) for m, b in zip(n[:2], box[:2], strict=True))
    kz = 2 * np.pi * np.fft.rfftfreq(n[2], box[2] / n[2])
    k = np.meshgrid(kx, ky, kz, indexing="ij")
    kmag = np.sqrt(k[0] ** 2 + k[1] ** 2 + k[2] ** 2)
    weight = np.full(kmag.shape, 2.0)
    weight[..., 0] = 1.0
    if n[2] % 2 == 0:
        weight[..., -1] = 1.0
    return kmag, k[axis] / np.where(kmag > 0, kmag, 1.0), weight


def _legendre(ell, mu):
    return {0: np.ones_like(mu), 2: 1.5 * mu**2 - 0.5, 4: (35 * mu**4 - 30 * mu**2 + 3) / 8}[ell]


def _binned(values, kmag, weight, cfg):
    """Weighted sum of ``values`` over the modes of each default bin (k = 0 excluded)."""
    edges = k_bin_edges(cfg)
    index = np.digitize(kmag, edges) - 1
    inside = (index >= 0) & (index < len(edges) - 1) & (kmag > 0)
    return np.bincount(index[inside], (weight * values)[inside], minlength=len(edges) - 1)


@pytest.mark.parametrize("grid", ["1x1", "2x2"])
def test_multipoles_of_a_field_with_anisotropic_power_are_the_mode_averages(grid):
    cfg = distpm.SimConfig(box_size=200.0, mesh_shape=(32, 16, 24), parallel=grid)
    axis, f = 0, 0.7
    kmag, mu, weight = _modes(cfg, axis)
    modes = np.fft.rfftn(np.random.default_rng(5).normal(size=cfg.mesh_shape))
    phases = modes / np.maximum(np.abs(modes), 1e-30)  # |mode| = 1: power (1 + f mu^2)^2
    field = np.fft.irfftn((1 + f * mu**2) * phases, s=cfg.mesh_shape, axes=(0, 1, 2))
    power = np.abs(np.fft.rfftn(field)) ** 2 * np.prod(cfg.box_size) / field.size**2
    n_modes = _binned(np.ones_like(kmag), kmag, weight, cfg)
    k, p, n = multipoles(np.float32(field), cfg, axis=axis, compensate=False)
    np.testing.assert_array_equal(np.asarray(n), n_modes)
    for row, ell in zip(np.asarray(p), (0, 2, 4), strict=True):
        want = (2 * ell + 1) * _binned(power * _legendre(ell, mu), kmag, weight, cfg)
        want /= np.maximum(n_modes, 1)
        np.testing.assert_allclose(row, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # the field's power is (1 + f mu^2)^2: P2 / P0 of bins of many modes is Kaiser's ratio
    ratio = np.asarray(p[1] / p[0])[np.asarray(n) > 200]
    assert len(ratio) == 4
    np.testing.assert_allclose(ratio, kaiser(1.0, f, 2) / kaiser(1.0, f, 0), rtol=0.03)


def test_a_runs_large_scales_follow_kaiser_on_every_grid():
    """P0 and P2 of a run in redshift space at k < 0.05 h/Mpc lie within 3 sigma of Kaiser's
    prediction averaged over each bin's own modes (sigma: the Gaussian cosmic variance of
    the bin's estimate), and agree on 1x1 and 2x2."""
    got = {}
    for grid in ("1x1", "2x2"):
        cfg = distpm.SimConfig(box_size=512.0, mesh_shape=32, n_steps=10, parallel=grid)
        final = distpm.simulate(distpm.white_noise(1, cfg), COSMO, cfg)
        delta = distpm.density(redshift_space(final, COSMO, cfg, axis=2), cfg)
        got[grid] = [np.asarray(x) for x in multipoles(delta, cfg, axis=2)]
    k, p, n = got["1x1"]
    np.testing.assert_allclose(p, got["2x2"][1], rtol=0, atol=1e-5 * np.abs(p[0]).max())
    kmag, mu, weight = _modes(cfg, 2)
    f = float(distpm.growth_rate(1.0, COSMO))
    p_s = np.asarray(distpm.linear_power(np.where(kmag > 0, kmag, 1.0), COSMO, 1.0))
    p_s = p_s * (1 + f * mu**2) ** 2
    low = (k > 0) & (k < 0.05)
    assert low.sum() == 4
    for row, ell in zip(p[:2], (0, 2), strict=True):
        factor = (2 * ell + 1) * _legendre(ell, mu)
        mean = _binned(factor * p_s, kmag, weight, cfg) / np.maximum(n, 1)
        var = _binned(weight * (factor * p_s) ** 2, kmag, np.ones_like(weight), cfg)
        sigma = np.sqrt(2 * var) / np.maximum(n, 1)  # see _modes: pairs of w = 1 modes
        assert np.all(np.abs(row - mean)[low] < 3 * sigma[low]), (ell, row[low], mean[low])


def test_radial_redshift_space_moves_particles_along_their_lines_of_sight():
    """Seen from an observer at the box centre: a particle moves by the momentum's component
    along its own line of sight (across the periodic boundary too), one at the observer
    stays, and particles straight up +z move as in the plane-parallel mapping along z."""
    cfg = distpm.SimConfig(box_size=100.0, mesh_shape=4, parallel="1x1")
    pos = [[60, 50, 50], [50, 50, 80], [50, 50, 50], [5, 50, 50], [50, 50, 70], [50, 50, 95]]
    vel = [[2, 3, 0], [0, 1, -4], [1, 1, 1], [1, 0, 0], [0, 2, 3], [1, 1, -2]]
    a = 0.5
    particles = distpm.Particles(
        pos=jnp.asarray(pos, jnp.float32), vel=jnp.asarray(vel, jnp.float32),
        ids=jnp.zeros((6, 2), jnp.int32), mask=jnp.ones(6, bool), a=jnp.float32(a),
    )  # fmt: skip
    out = np.asarray(radial_redshift_space(particles, COSMO, cfg, (50.0, 50.0, 50.0)).pos)
    scale = 1 / (a * a * float(E(a, COSMO)))
    want = np.asarray(pos, float)
    want[0, 0] += 2 * scale  # along +x: p_x
    want[1, 2] -= 4 * scale  # along +z: p_z
    want[3, 0] += 1 * scale  # x = 5 is 45 Mpc/h to the observer's -x side: p_x = +1 moves it
    want[4, 2] += 3 * scale
    want[5, 2] -= 2 * scale
    np.testing.assert_allclose(out, want % 100.0, rtol=0, atol=2e-5)
    along_z = np.asarray(redshift_space(particles, COSMO, cfg, axis=2).pos)
    np.testing.assert_allclose(out[[1, 4, 5]], along_z[[1, 4, 5]], rtol=0, atol=2e-5)
