"""Gradients of the final density against central finite differences (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import distpm

COSMO = distpm.Cosmology.planck18()


def _loss(noise, omega_c, sigma8, cfg):
    cosmo = COSMO.replace(Omega_c=omega_c, sigma8=sigma8)
    delta = distpm.density(distpm.simulate(noise, cosmo, cfg), cfg)
    return jnp.sum(delta**2)


@pytest.mark.parametrize(
    ("adjoint", "integrator"),
    [("reverse", "fastpm"), ("checkpoint", "fastpm"), ("reverse", "2lpt"), ("checkpoint", "2lpt")],
)
def test_gradient_matches_finite_differences(x64, adjoint, integrator):
    cfg = distpm.SimConfig(
        box_size=128.0,
        mesh_shape=16,
        n_steps=5,
        dtype="float64",
        adjoint=adjoint,
        integrator=integrator,
        parallel="1x1",
    )
    noise = distpm.white_noise(0, cfg)
    omega_c, sigma8 = jnp.float64(COSMO.Omega_c), jnp.float64(COSMO.sigma8)
    loss = jax.jit(_loss, static_argnums=3)
    g_noise, g_omega, g_sigma = jax.grad(loss, argnums=(0, 1, 2))(noise, omega_c, sigma8, cfg)
    assert np.all(np.isfinite(g_noise))

    def central(f, eps):
        return (f(eps) - f(-eps)) / (2 * eps)

    rng = np.random.default_rng(1)
    for _ in range(2):  # directional derivatives along random directions of noise space
        v = jnp.asarray(rng.normal(size=noise.shape))
        fd = central(lambda e, v=v: loss(noise + e * v, omega_c, sigma8, cfg), 1e-6)
        np.testing.assert_allclose(float(jnp.vdot(g_noise, v)), float(fd), rtol=1e-4)
    fd = central(lambda e: loss(noise, omega_c + e, sigma8, cfg), 1e-6)
    np.testing.assert_allclose(float(g_omega), float(fd), rtol=1e-4)
    fd = central(lambda e: loss(noise, omega_c, sigma8 + e, cfg), 1e-6)
    np.testing.assert_allclose(float(g_sigma), float(fd), rtol=1e-4)


def test_gradient_at_zero_noise_has_no_nan(x64):
    """k = 0 and empty fields are where 1/k^2 and sqrt(P) would give NaN."""
    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=8, n_steps=2, dtype="float64", parallel="1x1")
    noise = jnp.zeros(cfg.particle_shape)
    grads = jax.grad(_loss, argnums=(0, 1, 2))(noise, COSMO.Omega_c, COSMO.sigma8, cfg)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))


def test_gradient_in_every_cosmological_parameter_matches_finite_differences(x64):
    """d(loss)/d(n_s, Omega_b, h, w0, wa) through the whole run (transfer function, sigma8
    normalisation, growth, force), from one ``jax.grad`` over the ``Cosmology`` pytree."""
    cfg = distpm.SimConfig(
        box_size=128.0, mesh_shape=16, n_steps=5, dtype="float64", parallel="1x1"
    )
    noise = distpm.white_noise(0, cfg)
    cosmo = jax.tree.map(jnp.float64, COSMO.replace(w0=-0.95, wa=0.1))

    @jax.jit
    def loss(cosmo):
        return jnp.sum(distpm.density(distpm.simulate(noise, cosmo, cfg), cfg) ** 2)

    grads = jax.grad(loss)(cosmo)
    for name in ("n_s", "Omega_b", "h", "w0", "wa"):
        value, eps = getattr(cosmo, name), 1e-6
        fd = loss(cosmo.replace(**{name: value + eps})) - loss(cosmo.replace(**{name: value - eps}))
        np.testing.assert_allclose(float(getattr(grads, name)), float(fd) / (2 * eps), rtol=1e-4)
        assert abs(float(getattr(grads, name))) > 0, name  # each one reaches the loss


@pytest.mark.parametrize("integrator", ["fastpm", "2lpt"])
def test_gradient_memory_does_not_grow_with_the_steps(integrator):
    """The reverse-time adjoint keeps no state per step: the compiled gradient of 16 steps
    needs what that of 4 steps needs (to the bytes of its factors)."""
    from distpm import plan

    total = []
    for n_steps in (4, 16):
        cfg = distpm.SimConfig(
            box_size=64.0, mesh_shape=16, n_steps=n_steps, integrator=integrator, parallel="1x1"
        )
        programs = plan.memory_plan(COSMO, cfg, gradient=True)["programs"]
        total.append(programs["gradient"]["total_bytes"])
    assert total[1] <= total[0] + 1024, total


@pytest.mark.parametrize("mesh", [64, 512])
def test_gradient_memory_is_at_most_two_and_a_quarter_steps(mesh):
    """The reverse-time adjoint makes the force's fields one component at a time, kicks the
    momenta back in place and keeps no intermediates of the first kick or the initial
    conditions, nor zeros or kernels XLA would share across the program: XLA's plan of the
    gradient through a run on one device (compiled, not run) is at most 2.25 times the
    step's memory. At 512^3 (89 against 53 bytes per particle; 273, 5.2 times, when JAX
    differentiated the steps, and 179 before the shared zeros and kernels went) the paint
    and readout kernels take their particles in 64 blocks, as a large run does; at 64^3 in
    one block (174 against 93), where XLA had hoisted the readout's stencils out of the
    force's loop over components (306 against 117, 2.6 times; ``distpm.painting``)."""
    from distpm import plan

    cfg = distpm.SimConfig(box_size=2.0 * mesh, mesh_shape=mesh, parallel="1x1")
    programs = plan.memory_plan(COSMO, cfg, gradient=True)["programs"]
    per_particle = {name: m["bytes_per_particle"] for name, m in programs.items()}
    assert per_particle["gradient"] <= 2.25 * per_particle["step"], per_particle
