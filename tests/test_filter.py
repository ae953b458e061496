"""Fields filtered by a function of |k| (distpm.analysis.filter): each Fourier mode is scaled by
its factor, on every device grid; the log-determinant is the Jacobian's, with its gradient."""

import jax
import jax.numpy as jnp
import numpy as np

import distpm
from distpm.analysis.filter import filter_field, filter_log_determinant


def _cfg(grid, n=8, box=16.0):
    return distpm.SimConfig(box_size=box, mesh_shape=n, dtype="float64", parallel=grid)


def _plane_waves(n, box):
    x = np.arange(n) * box / n
    kf = 2 * np.pi / box
    xx, yy, zz = np.meshgrid(x, x, x, indexing="ij")
    waves = [np.cos(kf * xx), np.sin(2 * kf * yy + kf * zz), np.cos(3 * kf * zz)]
    return waves, kf * np.array([1.0, np.sqrt(5.0), 3.0])


def test_each_plane_wave_is_scaled_by_its_transfer_on_every_grid(x64):
    waves, kmags = _plane_waves(8, 16.0)
    field = sum(waves)

    def transfer(k):
        return jnp.exp(-k) * (1 + k**2)

    for grid in ((1, 1), (2, 2), (4, 2)):
        got = np.asarray(filter_field(jnp.asarray(field), _cfg(grid), transfer))
        want = sum(w * np.exp(-k) * (1 + k**2) for w, k in zip(waves, kmags, strict=True))
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_a_filter_on_the_particle_grid_and_a_clear_error_elsewhere(x64):
    cfg = distpm.SimConfig(box_size=16.0, mesh_shape=16, particle_shape=8, parallel=(2, 2))
    waves, kmags = _plane_waves(8, 16.0)
    got = filter_field(jnp.asarray(waves[1], jnp.float32), cfg, lambda k: 2 * k)
    np.testing.assert_allclose(np.asarray(got), 2 * kmags[1] * waves[1], atol=1e-5)
    try:
        filter_field(jnp.zeros((4, 4, 4)), cfg, lambda k: k)
    except ValueError as err:
        assert "neither the mesh" in str(err)
    else:
        raise AssertionError("a field on neither grid was filtered")


def test_log_determinant_is_the_jacobians_and_differentiable(x64):
    """Against slogdet of the filter's 64 x 64 Jacobian (4^3 cells, Nyquist planes included),
    and its derivative in a parameter the transfer closes over against finite differences."""
    cfg = distpm.SimConfig(box_size=8.0, mesh_shape=4, dtype="float64", parallel=(2, 2))

    def transfer(a):
        return lambda k: 1 / jnp.sqrt(1 + a * jnp.exp(-k))

    jacobian = jax.jacfwd(lambda u: filter_field(u.reshape(4, 4, 4), cfg, transfer(2.0)).ravel())
    sign, want = np.linalg.slogdet(np.asarray(jacobian(jnp.zeros(64))))
    assert sign == 1
    got = filter_log_determinant(cfg, transfer(2.0), dtype=jnp.float64)
    np.testing.assert_allclose(float(got), want, rtol=1e-12)

    def f(a):
        return filter_log_determinant(cfg, transfer(a), dtype=jnp.float64)

    h = 1e-6
    np.testing.assert_allclose(
        float(jax.grad(f)(2.0)), (float(f(2.0 + h)) - float(f(2.0 - h))) / (2 * h), rtol=1e-7
    )
