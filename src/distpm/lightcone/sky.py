"""Pixels on the sky: HEALPix (RING) and a flat gnomonic field, with smooth weights.

A direction is a vector r (n, 3) from the observer. Each direction is
shared between 4 pixels with bilinear weights that sum to 1 (HEALPix:
``jax_healpy.get_interp_weights``, the same weights as healpy's; flat:
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
import jax_healpy
import numpy as np


def healpix_pixels(r, nside: int):
    """(pix (n, 4) int32, weights (n, 4)) of directions r (n, 3) on a RING HEALPix map."""
    rho = jnp.sqrt(r[:, 0] ** 2 + r[:, 1] ** 2 + 1e-30)
    theta = jnp.arctan2(rho, r[:, 2])
    phi = jnp.arctan2(r[:, 1], r[:, 0])
    phi = jnp.where(phi < 0, phi + 2 * math.pi, phi)
    pix, w = jax_healpy.get_interp_weights(nside, theta, phi)
    return pix.T.astype(jnp.int32), w.T.astype(r.dtype)


def flat_edges(fov_deg: float, pixels: int) -> np.ndarray:
    """Gnomonic coordinates of the pixel edges of the flat field, (pixels + 1,) float64."""
    half = math.tan(math.radians(fov_deg) / 2)
    return np.linspace(-half, half, pixels + 1)


def flat_pixels(r, fov_deg: float, pixels: int):
    """(pix (n, 4) int32 into the flattened P x P map, weights (n, 4)) of directions r."""
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
        w.append(jnp.where(inside, wi * wj, 0))
    return jnp.stack(pix, -1), jnp.stack(w, -1).astype(r.dtype)


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

    The integral of the pixel's weight over directions, by the midpoint rule
    on sub x sub samples per pixel (HEALPix: the centres of the pixels at
    nside * sub; flat: a sub-pixel grid reaching one pixel beyond the field,
    whose directions also paint the edge pixels). The directions are in
    ``dtype``, that of the maps. sub = 8 integrates the response to 1e-3 (3e-3
    in the 8 pixels at the poles);
    it takes ~20 s at nside 256 on one CPU core (once per process).
    """
    with jax.ensure_compile_time_eval():
        if kind == "healpix":
            sub = min(sub, int(math.sqrt((2**31 - 1) / 12)) // nside)  # int32 pixel indices
            if sub < 1:
                raise ValueError(f"nside = {nside} is too large for the pixel response")
            fine = nside * sub
            total = np.zeros(12 * nside * nside)
            chunk = 1 << 22
            for start in range(0, 12 * fine * fine, chunk):
                ipix = np.arange(start, min(start + chunk, 12 * fine * fine))
                theta, phi = jax_healpy.pix2ang(fine, jnp.asarray(ipix, jnp.int32))
                r = jnp.stack(
                    [jnp.sin(theta) * jnp.cos(phi), jnp.sin(theta) * jnp.sin(phi), jnp.cos(theta)],
                    -1,
                ).astype(dtype)
                pix, w = healpix_pixels(r, nside)
                np.add.at(total, np.asarray(pix).ravel(), np.asarray(w, np.float64).ravel())
            return total * 4 * math.pi / (12 * fine * fine)
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
        pix, w = flat_pixels(jnp.asarray(r), fov_deg, pixels)
        total = np.zeros(pixels * pixels)
        np.add.at(
            total, np.asarray(pix).ravel(), (np.asarray(w, np.float64) * omega[:, None]).ravel()
        )
        return total


def paint(values, pix, w, n_pixels: int):
    """Sky map (n_sources, n_pixels): sum over particles of values (n_sources, n) x weights."""
    contrib = values[:, :, None] * w[None]  # (s, n, 4)
    flat = contrib.reshape(values.shape[0], -1)
    out = jnp.zeros((values.shape[0], n_pixels), values.dtype)
    return out.at[:, pix.reshape(-1)].add(flat, mode="promise_in_bounds")
