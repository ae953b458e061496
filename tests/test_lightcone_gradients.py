"""Gradients through the lightcone's maps: against finite differences (FastPM and 2LPT
integrators), equal on a grid and with checkpointed steps, and memory that does not grow
with the steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import optional_import

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

import distpm  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone  # noqa: E402

COSMO = distpm.Cosmology.planck18()

GRAD = distpm.SimConfig(
    box_size=400.0,
    mesh_shape=8,
    a_start=0.4,
    n_steps=4,
    dtype="float64",
    parallel={"exchange_factor": 0.5, "devices": "1x1"},
)
GRAD_LC = LightconeConfig(source_redshifts=(0.6,), nside=8, flat_fov=20.0, flat_pixels=8)


def _map_loss(cfg, lc):
    rng = np.random.default_rng(0)
    w_sphere = jnp.asarray(rng.normal(size=(1, 12 * lc.nside**2)))
    w_flat = jnp.asarray(rng.normal(size=(1, lc.flat_pixels, lc.flat_pixels)))
    base = distpm.Cosmology.planck18()

    def loss(noise, omega_c, sigma8):
        maps, _ = lightcone(noise, base.replace(Omega_c=omega_c, sigma8=sigma8), cfg, lc)
        return 1e3 * (jnp.sum(w_sphere * maps["healpix"]) + jnp.sum(w_flat * maps["flat"]))

    return loss


@pytest.fixture(scope="module")
def map_gradient():
    with jax.enable_x64(True):
        loss = _map_loss(GRAD, GRAD_LC)
        noise = distpm.white_noise(1, GRAD)
        args = (noise, jnp.float64(COSMO.Omega_c), jnp.float64(COSMO.sigma8))
        grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
        return loss, args, jax.tree.map(np.asarray, grads)


def test_map_gradients_match_finite_differences(map_gradient, x64):
    """Through the reverse-time adjoint. The maps are piecewise smooth (bilinear pixel
    weights have kinks where a particle passes a pixel centre), so the steps are small."""
    _assert_finite_differences(*map_gradient)


def test_2lpt_map_gradients_match_finite_differences(x64):
    """The 2LPT integrator's observers (two pieces of drift per step, a closing drift at a
    stop) through the reverse-time adjoint, as FastPM's above, and the same on 2x2."""
    cfg = GRAD.replace(integrator="2lpt", snapshots=(0.7,))
    loss = _map_loss(cfg, GRAD_LC)
    args = (distpm.white_noise(1, cfg), jnp.float64(COSMO.Omega_c), jnp.float64(COSMO.sigma8))
    grads = jax.tree.map(np.asarray, jax.grad(loss, argnums=(0, 1, 2))(*args))
    _assert_finite_differences(loss, args, grads)
    on_grid = _map_loss(cfg.on("2x2"), GRAD_LC)  # each device's share of the factors' cotangent
    noise = distpm.white_noise(1, cfg.on("2x2"))
    for g, r in zip(jax.grad(on_grid, argnums=(0, 1, 2))(noise, *args[1:]), grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-8, atol=1e-10 * np.abs(r).max())


def _assert_finite_differences(loss, args, grads):
    (noise, omega_c, sigma8), (g_noise, g_omega, g_sigma) = args, grads
    f = jax.jit(loss)
    eps = 1e-7

    def central(shift):
        return float(f(*shift(eps)) - f(*shift(-eps))) / (2 * eps)

    fd = central(lambda e: (noise, omega_c + e, sigma8))
    np.testing.assert_allclose(g_omega, fd, rtol=1e-4)
    fd = central(lambda e: (noise, omega_c, sigma8 + e))
    np.testing.assert_allclose(g_sigma, fd, rtol=1e-4)
    v = jnp.asarray(np.random.default_rng(5).normal(size=noise.shape))
    fd = central(lambda e: (noise + e * v, omega_c, sigma8))
    np.testing.assert_allclose(float(jnp.vdot(g_noise, v)), fd, rtol=1e-4)


def test_map_gradients_on_a_grid_equal_one_device(map_gradient, x64):
    _, (noise, omega_c, sigma8), ref = map_gradient
    cfg = GRAD.on("2x2")
    loss = _map_loss(cfg, GRAD_LC)
    grads = jax.grad(loss, argnums=(0, 1, 2))(distpm.white_noise(1, cfg), omega_c, sigma8)
    for g, r in zip(grads, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-8, atol=1e-10 * np.abs(r).max())


def test_checkpointed_steps_give_the_reverse_adjoints_gradients(map_gradient, x64):
    """adjoint="checkpoint" differentiates the stored steps (the recorder's own VJP inside
    ``jax.checkpoint``); the reverse adjoint integrates back in time: the same gradients
    up to float64 round-off."""
    _, (noise, omega_c, sigma8), ref = map_gradient
    loss = _map_loss(GRAD.replace(adjoint="checkpoint"), GRAD_LC)
    grads = jax.grad(loss, argnums=(0, 1, 2))(noise, omega_c, sigma8)
    for g, r in zip(grads, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), r, rtol=1e-8, atol=1e-10 * np.abs(r).max())


def test_map_gradient_memory_does_not_grow_with_steps():
    """XLA's memory analysis of the compiled gradient: 40 steps within 1.2x of 10."""
    peaks = []
    for steps in (10, 40):
        cfg = GRAD.replace(n_steps=steps, dtype="float32")
        loss = _map_loss(cfg, GRAD_LC)
        noise = distpm.white_noise(1, cfg)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        mem = grad.lower(noise, COSMO.Omega_c, COSMO.sigma8).compile().memory_analysis()
        peaks.append(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
    assert peaks[1] <= 1.2 * peaks[0], peaks
