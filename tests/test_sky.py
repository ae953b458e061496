"""Sky pixels: HEALPix and flat-field weights and responses against healpy and quadrature."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import optional_import
from scipy import integrate

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

from distpm.lightcone import sky  # noqa: E402


def _per_point_difference(pix, w, ref_pix, ref_w, npix):
    """Largest |weight - healpy's| over (point, pixel) pairs, the weights compared as
    distributions over pixels; ref_* as healpy returns them, (4, n)."""
    rows = np.repeat(np.arange(len(w)), 4).astype(np.int64)
    keys = np.concatenate([rows * npix + np.asarray(pix).ravel(), rows * npix + ref_pix.T.ravel()])
    values = np.concatenate([np.asarray(w, np.float64).ravel(), -ref_w.T.ravel()])
    _, where = np.unique(keys, return_inverse=True)
    diff = np.zeros(where.max() + 1)
    np.add.at(diff, where, values)
    return np.max(np.abs(diff))


def test_healpix_weights_are_healpys():
    """Bilinear HEALPix weights (float32 directions) equal healpy's (float64) pixel by pixel."""
    rng = np.random.default_rng(0)
    r = rng.normal(size=(20000, 3)).astype(np.float32) * rng.uniform(1, 900, (20000, 1))
    for nside in (16, 128):
        pix, w = sky.healpix_pixels(jnp.asarray(r), nside)
        theta, phi = healpy.vec2ang(r.astype(np.float64))
        ref_pix, ref_w = healpy.get_interp_weights(nside, theta, phi)
        assert _per_point_difference(pix, w, ref_pix, ref_w, 12 * nside**2) < 5e-4
        np.testing.assert_allclose(np.asarray(w).sum(1), 1.0, atol=1e-6)


def test_atan2_is_numpys_in_every_quadrant_with_its_derivative(x64):
    """sky.atan2 (a polynomial, for XLA's CPU backend) equals numpy's arctan2 to 3 ulp of pi in
    float32 and float64, signed zeros and axes included, and its JVP is (x dy - y dx) / r^2."""
    rng = np.random.default_rng(3)
    edges = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30]
    y0 = np.concatenate([np.repeat(edges, 6), rng.normal(size=100000)])
    x0 = np.concatenate(
        [np.tile(edges, 6), rng.normal(size=100000) * 10.0 ** rng.integers(-3, 4, 100000)]
    )
    for dtype in (np.float32, np.float64):
        y, x = y0.astype(dtype), x0.astype(dtype)
        got = np.asarray(sky.atan2(jnp.asarray(y), jnp.asarray(x)))
        assert got.dtype == dtype
        np.testing.assert_array_less(
            np.abs(got - np.arctan2(y, x)), 3 * np.pi * np.finfo(dtype).eps
        )
    y, x = rng.normal(size=(2, 64))
    gy, gx = jax.grad(lambda y, x: sky.atan2(y, x).sum(), argnums=(0, 1))(y, x)
    np.testing.assert_allclose(gy, x / (x * x + y * y), rtol=1e-12)
    np.testing.assert_allclose(gx, -y / (x * x + y * y), rtol=1e-12)


def test_flat_pixels_and_solid_angles():
    fov, p = 10.0, 8
    omega = sky.flat_solid_angles(fov, p)
    e = sky.flat_edges(fov, p)
    i, j = 2, 5  # one pixel by numerical integration of the gnomonic Jacobian
    ref = integrate.dblquad(
        lambda v, u: (1 + u * u + v * v) ** -1.5, e[i], e[i + 1], e[j], e[j + 1]
    )[0]
    np.testing.assert_allclose(omega[i, j], ref, rtol=1e-9)
    # a direction at a pixel centre gives that pixel all its weight; offsets are bilinear
    centre = 0.5 * (e[i] + e[i + 1]), 0.5 * (e[j] + e[j + 1])
    r = jnp.asarray([[centre[0] * 100, centre[1] * 100, 100.0]])
    pix, w = sky.flat_pixels(r, fov, p)
    assert np.asarray(pix)[0, np.argmax(w)] == i * p + j
    np.testing.assert_allclose(np.max(w), 1.0, atol=1e-5)
    behind = sky.flat_pixels(-r, fov, p)[1]
    assert float(jnp.sum(behind)) == 0.0  # behind the observer: not in the field


def test_healpix_weights_on_pixel_centres_and_near_the_poles_are_healpys(x64):
    """Directions exactly on pixel centres and ring edges (phi halfway between two centres
    or on one) are where the integer part and the fraction of the position along a ring
    must come from the same number; near the poles the pole's share is spread. Float64,
    point by point: each pixel gets healpy's weight to 1e-12."""
    nside = 8
    fine = 4 * nside  # the centres of a finer map fall on the map's centres and edges
    theta, phi = healpy.pix2ang(fine, np.arange(12 * fine**2))
    rng = np.random.default_rng(1)
    cap = healpy.pix2ang(nside, 0)[0]  # the first ring's colatitude
    polar = rng.uniform(0, cap, 500)
    theta = np.concatenate([theta, polar, np.pi - polar])
    phi = np.concatenate([phi, rng.uniform(0, 2 * np.pi, 1000)])
    r = healpy.ang2vec(theta, phi)
    pix, w = sky.healpix_pixels(jnp.asarray(r), nside)
    ref_pix, ref_w = healpy.get_interp_weights(nside, theta, phi)
    assert _per_point_difference(pix, w, ref_pix, ref_w, 12 * nside**2) < 1e-12


def test_healpix_weights_have_gradients_in_the_direction(x64):
    """The weights move smoothly with the direction: d/dr of a weighted sum equals central
    differences (float64, 1e-6)."""
    r = jnp.asarray(healpy.ang2vec(np.array([0.3, 1.2, 2.9]), np.array([0.4, 3.0, 5.5])))
    signal = jnp.cos(jnp.arange(12 * 16**2))

    def f(r):
        pix, w = sky.healpix_pixels(r, 16)
        return jnp.sum(w * signal[pix])

    grad = np.asarray(jax.grad(f)(r))
    eps = 1e-6
    for i in range(3):
        for j in range(3):
            e = np.zeros((3, 3))
            e[i, j] = eps
            fd = (f(r + e) - f(r - e)) / (2 * eps)
            assert abs(grad[i, j] - fd) <= 1e-6 * max(1.0, abs(fd)), (i, j, grad[i, j], fd)


def _midpoint_response(nside, sub):
    """[sr] each pixel's share of a uniform sky under healpy's interpolation weights, by the
    midpoint rule on sub x sub points per pixel (the pixel centres at nside * sub)."""
    fine = nside * sub
    pix, w = healpy.get_interp_weights(nside, *healpy.pix2ang(fine, np.arange(12 * fine**2)))
    total = np.bincount(pix.ravel(), w.ravel(), minlength=12 * nside**2)
    return total * 4 * np.pi / (12 * fine**2)


def test_healpix_response_is_the_limit_of_the_midpoint_rule():
    """Interpolation weights give rings unequal shares of a uniform sky (~20%). The response
    in closed form is the limit of a uniform sky painted with healpy's weights (summed
    independently, by the midpoint rule): its error falls as 1/sub^2 and is 1e-4 at 32 x 32
    points per pixel."""
    got = sky.response("healpix", nside=8)
    assert got.max() / got.min() > 1.1
    np.testing.assert_allclose(got.sum(), 4 * np.pi, rtol=1e-12)
    errors = np.array([np.abs(_midpoint_response(8, sub) / got - 1).max() for sub in (8, 16, 32)])
    assert errors[-1] < 2e-4, errors
    np.testing.assert_allclose(errors[:-1] / errors[1:], 4, rtol=0.02)
