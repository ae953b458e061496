"""Shear from convergence (Kaiser-Squires) on the sphere and on the flat field: the E mode's
spectrum, no B mode, the inverse relation, the sign of the shear around a mass, and the
flat field's gradient."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import optional_import

healpy = optional_import("healpy")

from distpm.lightcone import shear  # noqa: E402

NSIDE = 64


def _band_limited_kappa(lmax):
    ell = np.arange(lmax + 1)
    cl = np.zeros(lmax + 1)
    cl[2:] = 1e-4 / ell[2:] ** 2
    np.random.seed(3)  # noqa: NPY002 (healpy draws from numpy's global generator)
    return healpy.synfast(cl, NSIDE, lmax=lmax)


def test_sphere_shear_has_kappas_spectrum_no_b_mode_and_gives_kappa_back():
    """For l < 2 nside: C_EE = C_kappa (l + 2)(l - 1) / (l (l + 1)) to 1e-3, C_BB < 1e-3
    C_EE; the convergence made back from the E mode equals the input to 1e-4 (rms)."""
    lmax = 2 * NSIDE
    kappa = _band_limited_kappa(lmax)
    g1, g2 = shear.healpix_shear(kappa, lmax=lmax)
    e, b = shear.healpix_modes(g1, g2, lmax=lmax)
    ell = np.arange(2, lmax)
    c_kappa = healpy.alm2cl(healpy.map2alm(kappa, lmax=lmax, iter=3))[2:lmax]
    c_e, c_b = healpy.alm2cl(e)[2:lmax], healpy.alm2cl(b)[2:lmax]
    np.testing.assert_allclose(c_e, c_kappa * (ell + 2) * (ell - 1) / (ell * (ell + 1)), rtol=1e-3)
    assert np.all(c_b < 1e-3 * c_e)
    back = shear.convergence_from_modes(e, NSIDE, lmax)
    assert np.std(back - kappa) < 1e-4 * np.std(kappa)


def test_a_positive_convergence_shears_tangentially_on_the_sphere_and_the_flat_field():
    """Around a positive blob the stretch is across the line to it: gamma1 < 0 north and
    south of it on the sphere (gamma1 > 0 stretches along the meridian), > 0 east and west;
    on the flat field gamma1 < 0 along u, > 0 along v, and gamma2 < 0 along the diagonal."""
    theta, phi = healpy.pix2ang(NSIDE, np.arange(12 * NSIDE**2))
    centre = healpy.ang2vec(np.pi / 2, 0.0)
    dist = np.arccos(np.clip(healpy.ang2vec(theta, phi) @ centre, -1, 1))
    g1, g2 = shear.healpix_shear(np.exp(-0.5 * (dist / 0.05) ** 2))
    for (t, p), sign in (((1.47, 0), -1), ((1.67, 0), -1), ((np.pi / 2, 0.1), 1)):
        i = healpy.ang2pix(NSIDE, t, p)
        assert sign * g1[i] > 0.1 and abs(g2[i]) < 1e-3 * abs(g1[i])
    u = np.arange(64) - 32
    blob = np.exp(-0.5 * (u[:, None] ** 2 + u[None, :] ** 2) / 9.0)
    f1, f2 = (np.asarray(x) for x in shear.flat_shear(jnp.asarray(blob)))
    assert f1[40, 32] < 0 and f1[24, 32] < 0 and f1[32, 40] > 0 and f2[38, 38] < 0


def test_flat_shear_gives_kappa_back_and_is_differentiable():
    rng = np.random.default_rng(4)
    modes = np.fft.fft2(rng.normal(size=(2, 32, 32)))
    modes[:, 16, :] = modes[:, :, 16] = 0  # the Nyquist lines carry no gamma2 (see _kernels)
    kappa = jnp.asarray(np.fft.ifft2(modes).real)
    g1, g2 = shear.flat_shear(kappa)
    e, b = shear.flat_modes(g1, g2)
    mean = kappa.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(e, kappa - mean, atol=1e-5)
    assert float(jnp.max(jnp.abs(b))) < 1e-5
    # a linear map: the gradient of <gamma1, w> is its adjoint applied to w
    w = jnp.asarray(rng.normal(size=(2, 32, 32)))
    grad = jax.grad(lambda k: jnp.sum(shear.flat_shear(k)[0] * w))(kappa)
    x = jnp.asarray(rng.normal(size=(2, 32, 32)))
    np.testing.assert_allclose(jnp.sum(grad * x), jnp.sum(shear.flat_shear(x)[0] * w), rtol=1e-4)
