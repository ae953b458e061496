"""Record the past lightcone inside each drift: crossings, Born weights, sky maps.

The observer sees a point at comoving distance chi at the time a with
chi(a) = chi. During the drift of a step from a0 to a1 a particle moves
along x(a) = x0 + dx (D(a) - D(a0)) / (D(a1) - D(a0)) (FastPM's drift is
linear in the growth factor D), while the lightcone shrinks from chi(a0)
to chi(a1). The particle crosses it in this step when
|x(a0)| - chi(a0) < 0 <= |x(a1)| - chi(a1) (|x| measured from the
observer); the crossing time solves |x(a)| = chi(a) (a secant guess and
two Newton steps on the exact D(a) and chi(a), to float round-off). The
box is replicated periodically: every periodic image of a particle is a
particle of the lightcone, so each image that crosses is recorded once.

Cost: each step visits the replicas that can meet its shell (culled with
the device's particle bounds); in each, one pass over the particles finds
the crossings and lists their slots, and only those are solved and
painted, in batches of about 1/8 of the buffer (empty batches skipped).

Born convergence, painted particle by particle at its crossing (no shells):

    kappa(theta) = 3/2 Omega_m (H0/c)^2 sum_p V_p g(chi_p) / (a_p chi_p) W / Omega_pix

with V_p = L^3 / N the volume per particle, W = W(theta - theta_p) the
bilinear pixel weights (:mod:`distpm.lightcone.sky`), Omega_pix [sr] the pixel's response to a
uniform sky (its solid angle, up to the interpolation's uneven shares) and
g(chi) = 1 - chi / chi_s (or its average over n(z)) the lensing efficiency.
Each step's map has its mean over the map's area subtracted (for the
sphere, the mean density of the shell that step covers, which the box
replicas fill; for a flat field, the field's own mean).

Selection and gradients: a particle enters the map only once, at its exact
crossing, so the map is a continuous function of the trajectories (a
particle that crosses later or earlier moves to the neighbouring step at
the same chi); there is no cut on the Eulerian radius. The only hard edge,
chi = chi_s of the farthest source, carries weight g = 0. Gradients flow
through the crossing time and position, the Born weights and the bilinear
pixel weights.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from distpm import background
from distpm.lightcone import sky
from distpm.lightcone.config import LightconeConfig
from distpm.parallel import Layout
from distpm.parallel.migrate import compact


def _norm(x):
    return jnp.sqrt(jnp.sum(x * x, axis=-1) + 1e-30)


def tables(cosmo, cfg, lc: LightconeConfig):
    """Differentiable tables of a lightcone run: (per-step shells (steps, 6), the rest).

    shells[i] = (a0, a1, D(a0), D(a1), chi(a0), chi(a1)) of step i of cfg.time_grid.
    """
    dtype = cfg.float_dtype
    growth = background.growth_table(cosmo)
    dist = background.distance_table(cosmo, a_min=min(1e-3, 0.5 * cfg.a_start))
    grid = jnp.asarray(cfg.time_grid, dtype)
    d = background.growth(grid, growth)[0]
    chi = background.comoving_distance(grid, dist)
    shells = jnp.stack([grid[:-1], grid[1:], d[:-1], d[1:], chi[:-1], chi[1:]], -1).astype(dtype)
    chi_planes = background.comoving_distance(
        1.0 / (1.0 + jnp.asarray(lc.source_redshifts, dtype)), dist
    )
    g_chi, g_tab = _efficiency_tables(lc, dist, dtype)
    chi_max = background.comoving_distance(1.0 / (1.0 + lc.z_max), dist)
    rest = dict(
        growth=growth, dist=dist, chi_planes=chi_planes, g_chi=g_chi, g_tab=g_tab, chi_max=chi_max
    )
    return shells, jax.tree.map(lambda x: x.astype(dtype), rest)


def _efficiency_tables(lc, dist, dtype, size=512):
    """g(chi) of each n(z) on a chi grid (size,): int dz n(z) max(0, 1 - chi/chi(z)) / int n."""
    if not lc.distributions:
        return jnp.zeros((size,), dtype), jnp.zeros((0, size), dtype)
    chi_far = background.comoving_distance(1.0 / (1.0 + lc.z_max), dist)
    chi = jnp.linspace(0.0, 1.0, size, dtype=dtype) * chi_far
    out = []
    for d in lc.distributions:
        z, n = np.asarray(d.z), np.asarray(d.n)
        q = np.zeros_like(n)  # trapezoid weights, normalised
        q[1:] += 0.5 * np.diff(z) * n[1:]
        q[:-1] += 0.5 * np.diff(z) * n[:-1]
        q /= q.sum()
        a_z = jnp.maximum(1.0 / (1.0 + jnp.asarray(z, dtype)), dist.a_min)  # n = 0 beyond
        chi_z = background.comoving_distance(a_z, dist)
        kernel = jnp.maximum(0.0, 1.0 - chi[:, None] / chi_z[None, :])
        out.append(kernel @ jnp.asarray(q, dtype))
    return chi, jnp.stack(out)


def efficiency(chi, tab):
    """Lensing efficiency g (n_sources, n) at distances chi (n,) [Mpc/h]."""
    planes = jnp.maximum(0.0, 1.0 - chi[None, :] / tab["chi_planes"][:, None])
    spread = jax.vmap(lambda g: jnp.interp(chi, tab["g_chi"], g, right=0.0))(tab["g_tab"])
    return jnp.concatenate([planes, spread], axis=0)


def crossing(x0, dx, shell, tab, cosmo):
    """Where and when the trajectories x0 + t dx (relative to the observer) cross the lightcone.

    Returns (hit (n,) bool, a (n,) scale factor at the crossing, r (n, 3)
    position at the crossing relative to the observer [Mpc/h]).
    """
    a0, a1, d0, d1, chi0, chi1 = (shell[i] for i in range(6))
    f0 = _norm(x0) - chi0
    f1 = _norm(x0 + dx) - chi1
    hit = (f0 < 0) & (f1 >= 0)
    frac = jnp.where(hit, -f0 / jnp.where(hit, f1 - f0, 1.0), 0.5)
    a = a0 + (a1 - a0) * frac
    for _ in range(2):
        d, f, _, _ = background.growth(a, tab["growth"])
        x = x0 + ((d - d0) / (d1 - d0))[:, None] * dx
        r = _norm(x)
        drift = jnp.sum(x * dx, -1) / r * (f * d / a) / (d1 - d0)  # d|x|/da
        light = -background.C_OVER_H0 / (a * a * background.E(a, cosmo))  # dchi/da
        residual = r - background.comoving_distance(a, tab["dist"])
        a = jnp.clip(a - residual / (drift - light), a0, a1)
    d = background.growth(a, tab["growth"])[0]
    return hit, a, x0 + ((d - d0) / (d1 - d0))[:, None] * dx


@dataclasses.dataclass(frozen=True)
class Recorder:
    """The lightcone of a run ``cfg`` as ``lc`` describes it (static, hashable)."""

    lc: LightconeConfig
    cfg: object

    @functools.cached_property
    def tiles(self) -> np.ndarray:
        """[Mpc/h] (T, 3) shifts of the box replicas that can meet the lightcone."""
        cfg, lc = self.cfg, self.lc
        box = np.asarray(cfg.box_size)
        obs = lc.observer_position(cfg)
        chi_far = _chi_far(cfg, lc)
        reach = np.ceil(chi_far / box).astype(int) + 1
        n = np.stack(
            np.meshgrid(*[np.arange(-r, r + 1) for r in reach], indexing="ij"), -1
        ).reshape(-1, 3)
        shift = n * box
        nearest = np.clip(obs, shift, shift + box)  # the tile's point closest to the observer
        keep = np.linalg.norm(nearest - obs, axis=1) <= chi_far + 1e-3 * box.min()
        if lc.nside is None:  # only the flat field's cone matters
            centre = shift + 0.5 * box - obs
            dist = np.linalg.norm(centre, axis=1)
            radius = 0.5 * np.linalg.norm(box) + 0.05 * box.min()  # margin for the drift
            # the field's corner, widened by a pixel: bilinear weights reach edge pixels
            # from up to half a pixel outside the field
            half = math.tan(math.radians(lc.flat_fov) / 2)
            cone = math.atan(math.sqrt(2) * half * (1 + 2 / lc.flat_pixels))
            angle = np.arccos(np.clip(centre[:, 2] / np.maximum(dist, 1e-9), -1, 1))
            spread = np.arcsin(np.clip(radius / np.maximum(dist, 1e-9), 0, 1))
            keep &= (dist <= radius) | (angle - spread <= cone)
        return shift[keep]

    @property
    def n_pixels(self) -> dict:
        out = {}
        if self.lc.nside is not None:
            out["healpix"] = 12 * self.lc.nside**2
        if self.lc.flat_fov is not None:
            out["flat"] = self.lc.flat_pixels**2
        return out

    def empty_maps(self, dtype):
        """Zero maps of one device: per kind, (1 + n_sources, n_pixels): counts, then kappa."""
        s = 1 + self.lc.n_sources
        return {k: Layout.varying(jnp.zeros((s, n), dtype)) for k, n in self.n_pixels.items()}

    def _pixels(self, kind, r):
        if kind == "healpix":
            return sky.healpix_pixels(r, self.lc.nside)
        return sky.flat_pixels(r, self.lc.flat_fov, self.lc.flat_pixels)

    def _solid_angles(self, kind, dtype):
        """(pixel areas [sr], pixel responses to a uniform sky [sr]), both (n_pixels,)."""
        lc = self.lc
        if kind == "healpix":
            area = np.full(self.n_pixels[kind], sky.healpix_solid_angle(lc.nside))
            resp = sky.response("healpix", nside=lc.nside, dtype=np.dtype(dtype).name)
        else:
            area = sky.flat_solid_angles(lc.flat_fov, lc.flat_pixels).ravel()
            resp = sky.response(
                "flat",
                fov_deg=float(lc.flat_fov),
                pixels=lc.flat_pixels,
                dtype=np.dtype(dtype).name,
            )
        return jnp.asarray(area, dtype), jnp.asarray(resp, dtype)

    def step_maps(self, pos, dx, mask, shell, tab, cosmo):
        """This device's maps of the particles crossing in one drift (pos + t dx, t in [0, 1]).

        Row 0 of each map counts the crossings (bilinear, unnormalised); the
        other rows are each source's Born convergence of the step, its mean
        over the map's area subtracted.
        """
        cfg = self.cfg
        dtype = pos.dtype
        # typed per device before the tiles' conds, whose branches differ between devices:
        # the cotangents of these shared inputs are then summed over devices out here
        shell, tab, cosmo = jax.tree.map(Layout.varying, (shell, tab, cosmo))
        obs = jnp.asarray(self.lc.observer_position(cfg), dtype)
        x0 = pos - obs
        big = jnp.asarray(np.max(cfg.box_size) * 1e3, dtype)
        valid = mask[:, None]
        lo = jnp.min(jnp.where(valid, jnp.minimum(x0, x0 + dx), big), axis=0)
        hi = jnp.max(jnp.where(valid, jnp.maximum(x0, x0 + dx), -big), axis=0)
        chi_near, chi_far = shell[5], shell[4]
        volume = float(np.prod(cfg.box_size)) / float(np.prod(cfg.particle_shape))
        born = 1.5 * cosmo.Omega_m / background.C_OVER_H0**2 * volume
        empty = self.empty_maps(dtype)
        n = pos.shape[0]
        size = min(n, max(4096, -(-n // 8)))  # crossings solved and painted per batch
        n_batches = -(-n // size)

        def tile(shift):
            near = jnp.clip(jnp.zeros(3, dtype), lo + shift, hi + shift)
            far = jnp.maximum(jnp.abs(lo + shift), jnp.abs(hi + shift))
            meets = (_norm(near) <= chi_far) & (_norm(far) >= chi_near)
            meets &= chi_near <= tab["chi_max"]  # the lightcone ends at the farthest source

            def paint(_):
                x = x0 + shift
                hit = mask & (_norm(x) < shell[4]) & (_norm(x + dx) >= shell[5])
                # the crossing slots first, in one pass; each batch then slices its share
                order, count = compact(hit, n_batches * size)

                def batch(maps, first):
                    """Solve and paint the crossings ranked first .. first + batch_size - 1."""

                    def solve(_):
                        idx = jax.lax.dynamic_slice_in_dim(order, first, size)
                        real = jnp.arange(size) < count - first
                        take = lambda v: jnp.take(v, idx, axis=0, mode="clip")  # noqa: E731
                        crossed, a, r = crossing(take(x), take(dx), shell, tab, cosmo)
                        chi = _norm(r)
                        w = born * efficiency(chi, tab) / (a * chi)
                        values = jnp.concatenate([jnp.ones_like(chi)[None], w], 0)
                        seen = real & crossed & (chi <= tab["chi_max"])
                        values = values * seen.astype(dtype)[None]
                        out = {}
                        for kind, n_pix in self.n_pixels.items():
                            pix, pw = self._pixels(kind, r)
                            out[kind] = sky.paint(values, pix, pw, n_pix)
                        return out

                    seen = jax.lax.cond(first < count, solve, lambda _: empty, None)
                    return jax.tree.map(jnp.add, maps, seen), None

                firsts = jnp.arange(n_batches, dtype=jnp.int32) * size
                return jax.lax.scan(batch, empty, firsts)[0]

            return jax.lax.cond(meets, paint, lambda _: empty, None)

        tile = jax.checkpoint(tile)

        def body(maps, shift):
            return jax.tree.map(jnp.add, maps, tile(shift)), None

        shifts = jnp.asarray(self.tiles, dtype)
        maps, _ = jax.lax.scan(body, empty, shifts)
        out = {}
        for kind, m in maps.items():
            omega, resp = self._solid_angles(kind, dtype)
            kappa = m[1:] / resp
            mean = jnp.sum(kappa * omega, axis=1, keepdims=True) / jnp.sum(omega)
            out[kind] = jnp.concatenate([m[:1], kappa - mean], 0)
        return out


def _chi_far(cfg, lc) -> float:
    """[Mpc/h] a bound on the distance to the lightcone's far end, for the usual cosmologies.

    The tiles are static while the cosmology may be traced; chi(z) =
    c/H0 int dz / E(z) <= c/H0 z when E >= 1 in the past (w >= -1); the
    factor 1.1 covers phantom dark energy down to w0 ~ -2 at low z.
    """
    return 1.1 * background.C_OVER_H0 * lc.z_max
