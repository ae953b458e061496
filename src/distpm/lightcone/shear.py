"""Weak-lensing shear from the convergence (Kaiser & Squires 1993), on the flat field and
on the sphere, and the E and B modes of a shear field.

Both follow from the lensing potential psi: kappa = (1/2) (d1^2 + d2^2) psi,
gamma1 = (1/2) (d1^2 - d2^2) psi, gamma2 = d1 d2 psi.

- Flat field (JAX, differentiable): with l1 along the map's axis 0 (u) and
  l2 along axis 1 (v), gamma1 = (l1^2 - l2^2) / l^2 kappa and
  gamma2 = 2 l1 l2 / l^2 kappa on the map's FFT grid (the l = 0 mode, the
  mean, carries no shear). The field is treated as periodic, as its FFT
  grid is: the shear within a few pixels of an edge feels the opposite
  edge, and the inverse relation is exact. gamma1 > 0 stretches along u.
- Sphere (healpy, after the run: no gradient): the shear's E mode is
  E_lm = sqrt((l + 2)(l - 1) / (l (l + 1))) kappa_lm, B_lm = 0, mapped with
  healpy's spin-2 transform; gamma1 > 0 stretches along the meridian
  (theta), gamma2 > 0 along theta + phi. A positive convergence gives
  tangential shear around it.

Reduced shear: g = gamma / (1 - kappa).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def _kernels(shape):
    """(cos 2 phi_l, sin 2 phi_l) on the FFT grid of a map of ``shape``; 0 at l = 0. The
    Nyquist row and column of an even side have no Hermitian partner for the odd l1 l2:
    sin 2 phi is 0 there (their modes give no gamma2), so that the maps stay real."""
    l1 = jnp.fft.fftfreq(shape[0])[:, None]
    l2 = jnp.fft.fftfreq(shape[1])[None, :]
    l_sq = l1 * l1 + l2 * l2
    safe = jnp.where(l_sq > 0, l_sq, 1.0)
    nyquist = (l1 == -0.5) | (l2 == -0.5)
    cos = jnp.where(l_sq > 0, (l1 * l1 - l2 * l2) / safe, 0.0)
    return cos, jnp.where(nyquist, 0.0, 2 * l1 * l2 / safe)


def flat_shear(kappa):
    """(gamma1, gamma2) of flat convergence maps (..., P, P) (square pixels)."""
    c, s = _kernels(kappa.shape[-2:])
    k = jnp.fft.fft2(kappa)
    return jnp.fft.ifft2(c * k).real, jnp.fft.ifft2(s * k).real


def flat_modes(gamma1, gamma2):
    """(E, B) convergence-like maps of a flat shear field: E = kappa (less its mean, and
    less the Nyquist corner's mode, which carries no shear) for the shear of a
    convergence, B = 0."""
    c, s = _kernels(gamma1.shape[-2:])
    norm = c * c + s * s
    inverse = jnp.where(norm > 0, 1.0 / jnp.where(norm > 0, norm, 1.0), 0.0)
    g1, g2 = jnp.fft.fft2(gamma1), jnp.fft.fft2(gamma2)
    e, b = (c * g1 + s * g2) * inverse, (c * g2 - s * g1) * inverse
    return jnp.fft.ifft2(e).real, jnp.fft.ifft2(b).real


def _spin_factor(lmax):
    ell = np.arange(lmax + 1, dtype=float)
    out = np.zeros(lmax + 1)
    out[2:] = np.sqrt((ell[2:] + 2) * (ell[2:] - 1) / (ell[2:] * (ell[2:] + 1)))
    return out


def healpix_shear(kappa, lmax=None):
    """(gamma1, gamma2) HEALPix maps (RING) of a convergence map, to multipole ``lmax``
    (default 3 nside - 1)."""
    import healpy

    nside = healpy.npix2nside(len(kappa))
    lmax = 3 * nside - 1 if lmax is None else lmax
    alm = healpy.map2alm(np.asarray(kappa, np.float64), lmax=lmax, iter=3)
    e = healpy.almxfl(alm, _spin_factor(lmax))
    return healpy.alm2map_spin([e, np.zeros_like(e)], nside, 2, lmax)


def healpix_modes(gamma1, gamma2, lmax=None, iterations=3):
    """(E, B) harmonic coefficients of a HEALPix shear field, to ``lmax`` (default
    3 nside - 1); the quadrature is refined ``iterations`` times (as healpy's
    ``map2alm(iter=3)`` does for spin 0)."""
    import healpy

    nside = healpy.npix2nside(len(gamma1))
    lmax = 3 * nside - 1 if lmax is None else lmax
    maps = np.asarray([gamma1, gamma2], np.float64)
    alm = np.asarray(healpy.map2alm_spin(list(maps), 2, lmax=lmax))
    for _ in range(iterations):
        rest = maps - np.asarray(healpy.alm2map_spin(list(alm), nside, 2, lmax))
        alm = alm + np.asarray(healpy.map2alm_spin(list(rest), 2, lmax=lmax))
    return alm[0], alm[1]


def convergence_from_modes(e_alm, nside, lmax):
    """The convergence map whose shear has the E mode ``e_alm`` (the inverse relation)."""
    import healpy

    factor = _spin_factor(lmax)
    inverse = np.where(factor > 0, 1.0 / np.where(factor > 0, factor, 1.0), 0.0)
    return healpy.alm2map(healpy.almxfl(e_alm, inverse), nside, lmax=lmax)


def reduced(gamma, kappa):
    """The reduced shear g = gamma / (1 - kappa)."""
    return gamma / (1.0 - kappa)
