"""Pixels on the sky: HEALPix (RING) and a flat gnomonic field, with smooth weights.

A direction is a vector r (n, 3) from the observer. Each direction is
shared between 4 pixels with bilinear weights that sum to 1 (HEALPix:
the bilinear weights of healpy's ``get_interp_weights``, written here; flat:
bilinear between pixel centres), so a painted map moves smoothly with the
particles and has useful gradients. Directions are painted, not sampled:
the weights say how much of a particle each pixel receives.

Flat field: gnomonic coordinates (u, v) = (x / z, y / z) [rad at the
centre], a square |u|, |v| <= tan(fov / 2) split in P x P pixels; pixel
(i, j) (axis 0 along u) has its centre at the i-th u. Its exact solid angle is
F(u1, v1) - F(u0, v1) - F(u1, v0) + F(u0, v0), F(u, v) =
atan(u v / sqrt(1 + u^2 + v^2)). A particle's weight on pixels outside
the field is dropped (it lies outside the map).

Painting with interpolation weights does not give every pixel the same
share of a uniform sky: on HEALPix the share varies by ~10% between rings.
So a painted map is divided by each pixel's response to a uniform sky
(:func:`response`, [sr], the integral of its weight over the sphere),
not by its area: a uniform sky then paints a uniform map.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@functools.cache
def _rings(nside: int):
    """Per RING-scheme ring i = 0 .. 4 nside (0 and 4 nside are the poles), float64 and int32
    host tables: (theta [rad], pixels in the ring, first pixel, 0.5 if the pixel centres are
    shifted by half a pixel from phi = 0 else 0), from the HEALPix geometry (Gorski et al. 2005)."""
    i = np.arange(4 * nside + 1)
    cap = np.minimum(i, 4 * nside - i)  # rings from the nearer pole
    polar = cap < nside
    one_minus = cap**2 / (3.0 * nside**2)  # 1 - |z| in the caps
    z_abs = np.where(polar, 1 - one_minus, np.abs(4 / 3 - 2 * i / (3 * nside)))
    sin_t = np.where(polar, np.sqrt(one_minus * (2 - one_minus)), np.sqrt(1 - z_abs**2))
    theta = np.arctan2(sin_t, np.where(i <= 2 * nside, z_abs, -z_abs))
    count = np.where(polar, 4 * cap, 4 * nside)
    north = 2 * cap * (cap - 1)
    first = np.where(
        i < nside, north, np.where(i > 3 * nside, 12 * nside**2 - north - 4 * cap,
                                   2 * nside * (nside - 1) + 4 * nside * (i - nside))
    )  # fmt: skip
    shift = np.where(polar | ((i - nside) % 2 == 0), 0.5, 0.0)
    return theta, count.astype(np.int32), first.astype(np.int32), shift


def _atan_series(degree: int) -> tuple[float, ...]:
    """Power-series coefficients in v = u^2 of atan(u) / u on |u| <= tan(pi/8): Chebyshev
    interpolation in float64, exact to 1.4 float32 ulp at degree 4 and 9 float64 ulp at 9."""
    v_max = math.tan(math.pi / 8) ** 2
    v = np.polynomial.chebyshev.chebpts2(degree + 1) * 0.5 * v_max + 0.5 * v_max
    root = np.sqrt(np.maximum(v, 1e-300))
    f = np.where(v > 0, np.arctan(root) / root, 1.0)
    fit = np.polynomial.Chebyshev.fit(v, f, degree, domain=[0, v_max])
    power = fit.convert(kind=np.polynomial.Polynomial, domain=[-1, 1], window=[-1, 1])
    return tuple(float(c) for c in power.coef)  # Python floats: they take the array's dtype


_ATAN_SERIES = {np.dtype(np.float32): _atan_series(4), np.dtype(np.float64): _atan_series(9)}


@jax.custom_jvp
def atan2(y, x):
    """arctan2(y, x) in [-pi, pi] from arithmetic alone: XLA's CPU backend calls libm's
    atan2 element by element (26 ns each, half of :func:`healpix_columns`' time), where this
    vectorizes. Reduced to |u| <= tan(pi/8) by the octant and atan t = pi/4 + atan((t - 1)
    / (t + 1)), then a polynomial (:func:`_atan_series`)."""
    ax, ay = jnp.abs(x), jnp.abs(y)
    big, small = jnp.maximum(ax, ay), jnp.minimum(ax, ay)
    t = small / jnp.where(big > 0, big, 1)  # in [0, 1]
    far = t > math.tan(math.pi / 8)
    u = jnp.where(far, (t - 1) / (t + 1), t)
    v = u * u
    poly = jnp.zeros_like(v)
    for c in reversed(_ATAN_SERIES[np.dtype(x.dtype)]):
        poly = poly * v + c
    angle = jnp.where(far, math.pi / 4 + u * poly, u * poly)
    angle = jnp.where(ay > ax, math.pi / 2 - angle, angle)
    angle = jnp.where(jnp.signbit(x), math.pi - angle, angle)
    return jnp.where(jnp.signbit(y), -angle, angle)  # signed zeros as numpy: atan2(-0, -1) = -pi


@atan2.defjvp
def _atan2_jvp(primals, tangents):
    (y, x), (dy, dx) = primals, tangents
    r2 = x * x + y * y
    return atan2(y, x), (x * dy - y * dx) / jnp.where(r2 > 0, r2, 1)


def _ring_above(z, nside: int):
    """The ring at or north of colatitude cos = z (0: the north pole), as HEALPix defines it."""
    equator = jnp.floor(nside * (2 - 1.5 * z))
    cap = jnp.floor(nside * jnp.sqrt(3 * (1 - jnp.abs(z))))
    ring = jnp.where(jnp.abs(z) <= 2 / 3, equator, jnp.where(z > 0, cap, 4 * nside - cap - 1))
    return jnp.clip(ring, 0, 4 * nside - 1).astype(jnp.int32)


def _along_ring(phi, ring, tables):
    """(first pixel, second pixel, weight of the second) of phi's neighbours on ``ring``.

    The position along the ring is stored once (an optimization barrier), so the
    integer part and the fraction come from the same number: XLA may otherwise
    evaluate it twice with different rounding, and a direction on a pixel centre
    could take its index from one value and its weight from the other (seen on
    AVX-512 CPUs, where a pixel one step away got the whole weight).
    """
    _, count, first, shift = tables
    n = jnp.asarray(count)[ring]
    step = 2 * math.pi / n.astype(phi.dtype)
    t = lax.optimization_barrier(phi / step - jnp.asarray(shift, phi.dtype)[ring])
    left = jnp.floor(t)
    i = left.astype(jnp.int32) % n
    start = jnp.asarray(first)[ring]
    return start + i, start + (i + 1) % n, t - left


def healpix_pixels(r, nside: int):
    """(pix (n, 4) int32, weights (n, 4)) of directions r (n, 3) on a RING HEALPix map
    (:func:`healpix_columns`, stacked)."""
    pix, w = healpix_columns(r, nside)
    return jnp.stack(pix, -1), jnp.stack(w, -1)


def healpix_columns(r, nside: int):
    """(4 pixel arrays (n,) int32, their 4 weight arrays (n,)) of directions r (n, 3) on a
    RING HEALPix map.

    Bilinear in phi along the two rings around the direction and linear in theta
    between them, as healpy's ``get_interp_weights``; above the first ring (below
    the last) the pole's share is spread over that ring's four pixels.
    """
    tables = _rings(nside)
    norm = jnp.sqrt(r[:, 0] ** 2 + r[:, 1] ** 2 + r[:, 2] ** 2)  # not a reduce: see crossing.dot
    rho = jnp.sqrt(r[:, 0] ** 2 + r[:, 1] ** 2 + 1e-30)
    theta = atan2(rho, r[:, 2])
    phi = atan2(r[:, 1], r[:, 0])
    phi = jnp.where(phi < 0, phi + 2 * math.pi, phi)
    above = lax.optimization_barrier(_ring_above(r[:, 2] / norm, nside))  # one value, as t
    north, south = above == 0, above == 4 * nside - 1
    ring1, ring2 = jnp.maximum(above, 1), jnp.minimum(above + 1, 4 * nside - 1)
    p1, p2, f1 = _along_ring(phi, ring1, tables)
    p3, p4, f2 = _along_ring(phi, ring2, tables)
    ring_theta = jnp.asarray(tables[0], r.dtype)
    t1, t2 = ring_theta[above], ring_theta[above + 1]  # the poles at 0 and pi
    w_theta = jnp.clip((theta - t1) / (t2 - t1), 0, 1)
    pole = jnp.where(north, 1 - w_theta, jnp.where(south, w_theta, 0)) / 4
    # the pole's share: the ring's two other pixels get it in the empty slots
    npix = 12 * nside**2
    p1 = jnp.where(north, (p3 + 2) % 4, p1)
    p2 = jnp.where(north, (p4 + 2) % 4, p2)
    p3 = jnp.where(south, (p1 - npix + 6) % 4 + npix - 4, p3)
    p4 = jnp.where(south, (p2 - npix + 6) % 4 + npix - 4, p4)
    upper = jnp.where(north, 0, 1 - w_theta)
    lower = jnp.where(south, 0, w_theta)
    w = [(1 - f1) * upper + pole, f1 * upper + pole, (1 - f2) * lower + pole, f2 * lower + pole]
    return [p1, p2, p3, p4], [jnp.maximum(x, 0).astype(r.dtype) for x in w]


def flat_edges(fov_deg: float, pixels: int) -> np.ndarray:
    """Gnomonic coordinates of the pixel edges of the flat field, (pixels + 1,) float64."""
    half = math.tan(math.radians(fov_deg) / 2)
    return np.linspace(-half, half, pixels + 1)


def flat_pixels(r, fov_deg: float, pixels: int):
    """(pix (n, 4) int32 into the flattened P x P map, weights (n, 4)) of directions r
    (:func:`flat_columns`, stacked)."""
    pix, w = flat_columns(r, fov_deg, pixels)
    return jnp.stack(pix, -1), jnp.stack(w, -1)


def flat_columns(r, fov_deg: float, pixels: int):
    """(4 pixel arrays (n,) int32 into the flattened P x P map, their 4 weight arrays (n,))
    of directions r (n, 3)."""
    half = math.tan(math.radians(fov_deg) / 2)
    step = 2 * half / pixels
    ahead = r[:, 2] > 0
    z = jnp.where(ahead, r[:, 2], 1.0)
    uv = jnp.stack([r[:, 0] / z, r[:, 1] / z], axis=-1)
    s = (uv + half) / step - 0.5  # pixel centres at whole numbers
    first = jnp.floor(s)
    d = s - first
    first = first.astype(jnp.int32)
    pix, w = [], []
    for di, dj in ((0, 0), (0, 1), (1, 0), (1, 1)):
        i, j = first[:, 0] + di, first[:, 1] + dj
        wi = d[:, 0] if di else 1 - d[:, 0]
        wj = d[:, 1] if dj else 1 - d[:, 1]
        inside = ahead & (i >= 0) & (i < pixels) & (j >= 0) & (j < pixels)
        pix.append(jnp.where(inside, i * pixels + j, 0))
        w.append(jnp.where(inside, wi * wj, 0).astype(r.dtype))
    return pix, w


def flat_solid_angles(fov_deg: float, pixels: int) -> np.ndarray:
    """[sr] exact solid angle of every pixel of the flat field, (P, P) float64."""
    e = flat_edges(fov_deg, pixels)
    u, v = np.meshgrid(e, e, indexing="ij")
    f = np.arctan(u * v / np.sqrt(1 + u**2 + v**2))
    return f[1:, 1:] - f[:-1, 1:] - f[1:, :-1] + f[:-1, :-1]


def healpix_solid_angle(nside: int) -> float:
    """[sr] the solid angle of every HEALPix pixel."""
    return 4 * math.pi / (12 * nside * nside)


@functools.lru_cache(maxsize=8)
def response(kind, nside=0, fov_deg=0.0, pixels=0, sub=8, dtype="float32"):
    """[sr] each pixel's painted weight from a uniform sky, (n_pixels,) float64 (host, cached).

    HEALPix: exact (:func:`_healpix_response`). Flat: the midpoint rule on
    sub x sub samples per pixel of a sub-pixel grid reaching one pixel beyond
    the field, whose directions also paint the edge pixels; the directions
    are in ``dtype``, that of the maps.
    """
    if kind == "healpix":
        return _healpix_response(nside)
    half = math.tan(math.radians(fov_deg) / 2)
    step = 2 * half / pixels
    n = (pixels + 2) * sub
    edges = np.linspace(-half - step, half + step, n + 1)
    u, v = np.meshgrid(edges, edges, indexing="ij")
    f = np.arctan(u * v / np.sqrt(1 + u**2 + v**2))
    omega = (f[1:, 1:] - f[:-1, 1:] - f[1:, :-1] + f[:-1, :-1]).ravel()
    mid = 0.5 * (edges[1:] + edges[:-1])
    uu, vv = np.meshgrid(mid, mid, indexing="ij")
    r = np.stack([uu.ravel(), vv.ravel(), np.ones(uu.size)], -1).astype(dtype)
    with jax.ensure_compile_time_eval():  # values, also when called while tracing
        pix, w = flat_pixels(jnp.asarray(r), fov_deg, pixels)
    weights = np.asarray(w, np.float64) * omega[:, None]
    return np.bincount(np.asarray(pix).ravel(), weights.ravel(), minlength=pixels * pixels)


def _healpix_response(nside: int) -> np.ndarray:
    """[sr] the integral over the sphere of each HEALPix pixel's weight, in closed form.

    A pixel's weight is a hat in phi along its ring times a hat in theta between
    the ring centres (:func:`healpix_columns`). Along a ring of n pixels the hats
    sum to 1 and are shifts of one another, so each integrates to 2 pi / n in
    phi whatever theta. What remains is, per ring i with centre t_i, the integral
    of sin(theta) times the rising hat from t_(i-1) and the falling one to
    t_(i+1); between the pole and the first ring the pole's share goes to that
    ring's four pixels alike, so there the weight is 1. The same for every pixel
    of a ring; the midpoint rule on sub x sub points per pixel converges to it
    as 1 / sub^2 (``tests/test_sky.py``).
    """
    theta, count, _, _ = _rings(nside)
    a, b = theta[:-1], theta[1:]  # the segments between ring centres (and the poles)
    mean_sin = (np.sin(b) - np.sin(a)) / (b - a)
    rising = mean_sin - np.cos(b)  # int_a^b (t - a) / (b - a) sin t dt
    falling = np.cos(a) - mean_sin  # int_a^b (b - t) / (b - a) sin t dt
    rising[0], falling[-1] = 1 - np.cos(b[0]), 1 + np.cos(a[-1])  # the pole's segments
    rings = count[1:-1]
    return np.repeat(2 * np.pi / rings * (rising[:-1] + falling[1:]), rings)


def paint(maps, values, pix, w):
    """``maps`` (n_pixels, n_values) plus, per particle, its values (n, n_values) times its
    pixel weights at its pixels, given as columns (:func:`healpix_columns`).

    One scatter per column: interleaving the columns into (n, 4) arrays first costs XLA's
    CPU backend more than all the arithmetic before it (it evaluates their shared terms once
    per column)."""
    for p, weight in zip(pix, w, strict=True):
        maps = maps.at[p].add(values * weight[:, None], mode="promise_in_bounds")
    return maps
