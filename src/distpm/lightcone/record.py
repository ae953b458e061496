"""Record the past lightcone inside each drift: crossings, Born weights, sky maps.

The observer sees a point at comoving distance chi at the time a with
chi(a) = chi. During a piece of drift from a0 to a1 (a step of FastPM, half a
step of the 2LPT integrator: :func:`distpm.nbody.schedule.drift_knots`) a particle
moves along x(a) = x0 + dx (D(a) - D(a0)) / (D(a1) - D(a0)) (both integrators drift
linearly in the growth factor D), while the lightcone shrinks from chi(a0)
to chi(a1). The particle crosses it in this piece when
|x(a0)| - chi(a0) < 0 <= |x(a1)| - chi(a1) (|x| measured from the
observer); the crossing time solves |x(a)| = chi(a) (a secant guess and
two Newton steps on D and chi, each a Chebyshev series in ln a over the
piece that equals the tables to 1e-9, to float round-off). The
box is replicated periodically: every periodic image of a particle is a
particle of the lightcone, so each image that crosses is recorded once.

Cost: the work is one solve per crossing plus a look at the particles near
the shell. Each piece visits the replicas that can meet its shell (culled
with the device's particle bounds); in each, the buffer's chunks of CHUNK
consecutive slots whose bounding box meets the shell are examined particle
by particle, and the crossings go into one list for the whole piece, which
is solved and painted whenever it is full (``Recorder.batch_size``, about
1/8 of the buffer) and at the end: every batch but the last is at least
3/4 full, however many replicas the crossings come from. Without a HEALPix
map, chunks and particles outside the flat field's cone are skipped too,
and a piece that ends beyond the lightcone's far end looks at nothing.

Born convergence, painted particle by particle at its crossing (no shells):

    kappa(theta) = 3/2 Omega_m (H0/c)^2 sum_p V_p g(chi_p) / (a_p chi_p) W / Omega_pix

with V_p = L^3 / N the volume per particle, W = W(theta - theta_p) the
bilinear pixel weights (:mod:`distpm.lightcone.sky`), Omega_pix [sr] the pixel's response to a
uniform sky (its solid angle, up to the interpolation's uneven shares) and
g(chi) = 1 - chi / chi_s (or its average over n(z)) the lensing efficiency.
Each piece's map has its mean over the map's area subtracted (for the
sphere, the mean density of the shell that piece covers, which the box
replicas fill; for a flat field, the field's own mean). The division by the
responses and the subtraction are linear, so a run adds the pieces' raw
maps (:meth:`Recorder.add`) and normalises their sum once at the end
(:meth:`Recorder.normalise`): the same map, without a pass over the full
maps at every step.

Selection and gradients: a particle enters the map only once, at its exact
crossing, so the map is a continuous function of the trajectories (a
particle that crosses later or earlier moves to the neighbouring piece at
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
from distpm.lightcone.crossing import crossing, norm
from distpm.nbody.schedule import drift_knots
from distpm.ops import compact, running_sum
from distpm.ops.platform import HIGHEST
from distpm.parallel import Layout


def tables(cosmo, cfg, lc: LightconeConfig):
    """Differentiable tables of a lightcone run: (shells (pieces, 6), the rest).

    shells[i] = (a0, a1, D(a0), D(a1), chi(a0), chi(a1)) of the i-th piece of drift the
    observers see (:func:`distpm.nbody.schedule.drift_knots`: the steps of FastPM, the
    half steps of the 2LPT integrator).
    """
    dtype = cfg.float_dtype
    growth = background.growth_table(cosmo)
    dist = background.distance_table(cosmo, a_min=min(1e-3, 0.5 * cfg.a_start))
    grid = drift_knots(cosmo, cfg).astype(dtype)
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
        out.append(jnp.matmul(kernel, jnp.asarray(q, dtype), precision=HIGHEST))
    return chi, jnp.stack(out)


def efficiency(chi, tab):
    """Lensing efficiency g (n_sources, n) at distances chi (n,) [Mpc/h]."""
    planes = jnp.maximum(0.0, 1.0 - chi[None, :] / tab["chi_planes"][:, None])
    spread = jax.vmap(lambda g: jnp.interp(chi, tab["g_chi"], g, right=0.0))(tab["g_tab"])
    return jnp.concatenate([planes, spread], axis=0)


CHUNK = 16  # consecutive slots culled together against a replica's shell


def _chunk_boxes(x0, dx, mask, big):
    """(lo, hi) (n_chunks, 3): bounding boxes of the drifts x0 .. x0 + dx of each CHUNK
    consecutive slots, masked slots left out (an empty chunk gets lo = big, hi = -big)."""
    n, dtype = x0.shape[0], x0.dtype
    n_chunks = -(-n // CHUNK)

    def chunks(v):
        v = jnp.pad(v, ((0, n_chunks * CHUNK - n), (0, 0)))
        return v.reshape(n_chunks, CHUNK, v.shape[1])

    valid = chunks(mask[:, None].astype(dtype)) > 0
    x1 = x0 + dx
    lo = jnp.min(jnp.where(valid, jnp.minimum(chunks(x0), chunks(x1)), big), axis=1)
    hi = jnp.max(jnp.where(valid, jnp.maximum(chunks(x0), chunks(x1)), -big), axis=1)
    return lo, hi


def _in_cone(c, dist, radius, cone: float):
    """Whether balls (centre c (..., 3), |c| = dist, radius) reach into the cone of half-angle
    cone < pi/2 about +z: the angle of c from +z is at most cone + asin(radius / |c|),
    compared as cosines."""
    s = jnp.minimum(radius / dist, 1)
    bound = math.cos(cone) * jnp.sqrt(1 - s * s) - math.sin(cone) * s
    return (s >= 1) | (c[..., 2] >= dist * bound)


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
        if self.cone is not None:  # only the flat field's cone matters
            centre = shift + 0.5 * box - obs
            dist = np.linalg.norm(centre, axis=1)
            radius = 0.5 * np.linalg.norm(box) + 0.05 * box.min()  # margin for the drift
            angle = np.arccos(np.clip(centre[:, 2] / np.maximum(dist, 1e-9), -1, 1))
            spread = np.arcsin(np.clip(radius / np.maximum(dist, 1e-9), 0, 1))
            keep &= (dist <= radius) | (angle - spread <= self.cone)
        return shift[keep]

    @functools.cached_property
    def cone(self) -> float | None:
        """[rad] Half-angle, about the +z axis, of a cone holding the flat field (None with a
        HEALPix map, which sees the whole sky): the field's corner, widened by a pixel, as
        bilinear weights reach edge pixels from up to half a pixel outside the field."""
        if self.lc.nside is not None:
            return None
        half = math.tan(math.radians(self.lc.flat_fov) / 2)
        return math.atan(math.sqrt(2) * half * (1 + 2 / self.lc.flat_pixels))

    @property
    def n_pixels(self) -> dict:
        out = {}
        if self.lc.nside is not None:
            out["healpix"] = 12 * self.lc.nside**2
        if self.lc.flat_fov is not None:
            out["flat"] = self.lc.flat_pixels**2
        return out

    def empty_maps(self, dtype):
        """Zero raw maps of one device: per kind, (n_pixels, 1 + n_sources): counts, then the
        sources' Born sums. Pixel-major: a crossing's values for one pixel are then
        adjacent, one cache line to update instead of one per row (a full-sky map of
        nside 512 is 37 MB, far beyond the caches)."""
        s = 1 + self.lc.n_sources
        return {k: Layout.varying(jnp.zeros((n, s), dtype)) for k, n in self.n_pixels.items()}

    def _pixels(self, kind, r):
        if kind == "healpix":
            return sky.healpix_columns(r, self.lc.nside)
        return sky.flat_columns(r, self.lc.flat_fov, self.lc.flat_pixels)

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

    def batch_size(self, n: int) -> int:
        """Crossings solved and painted together (a batch) on a buffer of n slots."""
        return min(n, max(4096, -(-n // 8)))

    def add(self, maps, pos, dx, mask, shell, tab, cosmo):
        """``maps`` (raw, as :meth:`empty_maps`) plus this device's particles that cross the
        lightcone in one drift (pos + t dx, t in [0, 1]): row 0 counts the crossings
        (bilinear shares), the other rows sum each source's Born weights; see
        :meth:`normalise`.
        """
        # typed per device: the cotangents of these shared inputs are then summed over the
        # devices out here, by JAX's transpose of the cast
        shell, tab, cosmo = jax.tree.map(Layout.varying, (shell, tab, cosmo))
        obs = jnp.asarray(self.lc.observer_position(self.cfg), pos.dtype)
        return _painted(self, maps, pos - obs, dx, mask, shell, tab, cosmo)

    def normalise(self, maps):
        """Raw maps (n_pixels, counts and Born sums) -> (counts, convergence) (1 + n_sources,
        n_pixels): each source's Born sums divided by the pixels' responses, their mean over
        the map's area subtracted.

        Linear in the maps, so normalising the sum of all steps' maps (and of
        all devices') equals summing each step's normalised map: a run adds
        raw maps and normalises once, at the end.
        """
        out = {}
        for kind, m in maps.items():
            omega, resp = self._solid_angles(kind, m.dtype)
            m = m.T
            kappa = m[1:] / resp
            mean = jnp.sum(kappa * omega, axis=1, keepdims=True) / jnp.sum(omega)
            out[kind] = jnp.concatenate([m[:1], kappa - mean], 0)
        return out

    def step_maps(self, pos, dx, mask, shell, tab, cosmo):
        """This device's normalised maps of the particles crossing in one drift."""
        raw = self.add(self.empty_maps(pos.dtype), pos, dx, mask, shell, tab, cosmo)
        return self.normalise(raw)

    def _values(self, x, dx, real, shell, tab, cosmo):
        """(values (n, 1 + n_sources), directions r (n, 3)) of crossings x + t dx: a count of
        1 and the Born weights, zero where not ``real`` or beyond the lightcone's end."""
        volume = float(np.prod(self.cfg.box_size)) / float(np.prod(self.cfg.particle_shape))
        born = 1.5 * cosmo.Omega_m / background.C_OVER_H0**2 * volume
        crossed, a, r = crossing(x, dx, shell, tab)
        chi = norm(r)
        w = born * efficiency(chi, tab) / (a * chi)
        seen = real & crossed & (chi <= tab["chi_max"])
        values = jnp.concatenate([jnp.ones_like(chi)[:, None], w.T], 1)
        return values * seen.astype(x.dtype)[:, None], r

    def _crossings(self, x0, dx, slots, tiles, count):
        """Positions (relative to the observer, in their replica) and drifts of a batch."""
        shifts = jnp.asarray(self.tiles, x0.dtype)
        x = jnp.take(x0, slots, axis=0, mode="clip") + jnp.take(shifts, tiles, axis=0, mode="clip")
        real = jnp.arange(slots.shape[0]) < count
        return x, jnp.take(dx, slots, axis=0, mode="clip"), real

    def sweep(self, x0, dx, mask, shell, tab, visit, acc):
        """Call ``acc = visit(acc, slots, tiles, count)`` on every crossing of the drift.

        x0 (n, 3) relative to the observer. The crossings, each a (slot,
        replica) pair, are collected in a list of ``batch_size(n)`` entries
        (the first ``count`` in use) and handed over when it is full and at
        the end; so every solve but the last is at least 3/4 full, whatever
        the number of replicas. Finding them: the buffer is cut into chunks
        of CHUNK consecutive slots (a run of lattice neighbours while the
        particles keep their initial slots, and a correct if looser bound
        otherwise); per replica meeting the shell, only the chunks whose
        bounding box meets it are examined, particle by particle.
        """
        x0, dx = jax.lax.stop_gradient((x0, dx))

        def look(acc):
            return self._sweep(x0, dx, mask, shell, tab, visit, acc)

        # a step beyond the lightcone's far end: nothing to look at
        return jax.lax.cond(shell[5] <= tab["chi_max"], look, lambda acc: acc, acc)

    def _sweep(self, x0, dx, mask, shell, tab, visit, acc):
        n, dtype = x0.shape[0], x0.dtype
        size = max(self.batch_size(n), min(n, CHUNK))  # a pass's hits always fit
        n_chunks = -(-n // CHUNK)
        per_pass = max(1, size // (4 * CHUNK))  # chunks examined at a time
        big = float(np.max(self.cfg.box_size) * 1e3)
        lo, hi = _chunk_boxes(x0, dx, mask, big)
        chi_far, chi_near, chi_max = shell[4], shell[5], tab["chi_max"]
        shifts = jnp.asarray(self.tiles, dtype)
        cone = self.cone if self.cone is not None and self.cone < math.pi / 2 else None

        def meets(lo, hi, shift):
            """Whether boxes (lo, hi) + shift can hold a crossing the maps see."""
            lo, hi = lo + shift, hi + shift
            near = norm(jnp.clip(jnp.zeros(3, dtype), lo, hi))
            far = norm(jnp.maximum(jnp.abs(lo), jnp.abs(hi)))
            # with a relative slack: the particles' own tests round differently
            out = near <= jnp.minimum(chi_far, chi_max) * (1 + 1e-6)
            out &= far >= chi_near * (1 - 1e-6)
            if cone is None:
                return out
            c = 0.5 * (lo + hi)  # the box's bounding ball
            return out & _in_cone(c, norm(c), 0.5 * norm(hi - lo), cone)

        def flush(carry):
            slots, tiles, count, acc = carry
            return slots, tiles, jnp.zeros_like(count), visit(acc, slots, tiles, count)

        def examine(t, carry):
            """Add replica t's crossings to the list, flushing it when it fills."""
            shift = shifts[t]
            order, n_meet = compact(meets(lo, hi, shift), n_chunks + per_pass)

            def more(c):
                return c[0] < n_meet

            def one_pass(c):
                first, carry = c
                chunks = jax.lax.dynamic_slice_in_dim(order, first, per_pass)
                slot = (chunks[:, None] * CHUNK + jnp.arange(CHUNK, dtype=jnp.int32)).ravel()
                x = jnp.take(x0, slot, axis=0, mode="clip") + shift
                step = jnp.take(dx, slot, axis=0, mode="clip")
                r0, r1 = norm(x), norm(x + step)
                live = (slot < n) & jnp.take(mask, slot, mode="clip")
                # the whole segment beyond the lightcone's end: nothing to see
                hit = live & (r0 < chi_far) & (r1 >= chi_near)
                hit &= jnp.maximum(r0, r1) - norm(step) <= chi_max * (1 + 1e-6)
                if cone is not None:  # the crossing lies within |dx| of x0
                    hit &= _in_cone(x, r0, norm(step), cone)
                n_hit = jnp.sum(hit, dtype=jnp.int32)
                carry = jax.lax.cond(carry[2] + n_hit > size, flush, lambda c: c, carry)
                slots, tiles, count, acc = carry
                target = jnp.where(hit, count + running_sum(hit, jnp.int32) - 1, size)
                slots = slots.at[target].set(slot, mode="drop")
                tiles = tiles.at[target].set(t, mode="drop")
                return first + per_pass, (slots, tiles, count + n_hit, acc)

            zero = jnp.zeros_like(n_meet)
            return jax.lax.while_loop(more, one_pass, (zero, carry))[1]

        box_lo, box_hi = jnp.min(lo, axis=0), jnp.max(hi, axis=0)

        def replica(t, carry):
            hits = meets(box_lo, box_hi, shifts[t])
            return jax.lax.cond(hits, functools.partial(examine, t), lambda c: c, carry)

        slots, tiles = Layout.varying(jnp.zeros((size,), jnp.int32), jnp.zeros((size,), jnp.int32))
        count = Layout.varying(jnp.zeros((), jnp.int32))
        carry = jax.lax.fori_loop(0, shifts.shape[0], replica, (slots, tiles, count, acc))
        return jax.lax.cond(carry[2] > 0, flush, lambda c: c, carry)[3]

    def paint(self, maps, x, dx, real, shell, tab, cosmo):
        """``maps`` plus the crossings of x + t dx where ``real``."""
        values, r = self._values(x, dx, real, shell, tab, cosmo)
        out = {}
        for kind, m in maps.items():
            out[kind] = sky.paint(m, values, *self._pixels(kind, r))
        return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _painted(rec, maps, x0, dx, mask, shell, tab, cosmo):
    """``maps`` plus the raw maps of the drift's crossings; x0 relative to the observer.

    A hand-written VJP: the list of crossings is piecewise constant in the
    inputs, so the backward pass sweeps the same crossings again and pulls
    each batch's cotangent back through its crossing times, weights and
    pixels; nothing is stored per batch or per replica.
    """

    def visit(maps, slots, tiles, count):
        x, step, real = rec._crossings(x0, dx, slots, tiles, count)
        return rec.paint(maps, x, step, real, shell, tab, cosmo)

    return rec.sweep(x0, dx, mask, shell, tab, visit, maps)


def _painted_fwd(rec, maps, x0, dx, mask, shell, tab, cosmo):
    out = _painted(rec, maps, x0, dx, mask, shell, tab, cosmo)
    return out, (x0, dx, mask, shell, tab, cosmo)


def _painted_bwd(rec, residuals, g_maps):
    x0, dx, mask, shell, tab, cosmo = residuals

    def visit(acc, slots, tiles, count):
        g_x0, g_dx, g_rest = acc
        x, step, real = rec._crossings(x0, dx, slots, tiles, count)

        def dot(x, step, rest):
            maps = rec.paint(jax.tree.map(jnp.zeros_like, g_maps), x, step, real, *rest)
            return sum(jnp.vdot(g_maps[k], m, precision=HIGHEST) for k, m in maps.items())

        gx, gd, gr = jax.grad(dot, argnums=(0, 1, 2))(x, step, (shell, tab, cosmo))
        g_x0 = g_x0.at[slots].add(gx, mode="drop")
        g_dx = g_dx.at[slots].add(gd, mode="drop")
        return g_x0, g_dx, jax.tree.map(jnp.add, g_rest, gr)

    zeros = jax.tree.map(jnp.zeros_like, (x0, dx, (shell, tab, cosmo)))
    g_x0, g_dx, (g_shell, g_tab, g_cosmo) = rec.sweep(x0, dx, mask, shell, tab, visit, zeros)
    return g_maps, g_x0, g_dx, None, g_shell, g_tab, g_cosmo


_painted.defvjp(_painted_fwd, _painted_bwd)


def _chi_far(cfg, lc) -> float:
    """[Mpc/h] a bound on the distance to the lightcone's far end, for the usual cosmologies.

    The tiles are static while the cosmology may be traced; chi(z) =
    c/H0 int dz / E(z) <= c/H0 z when E >= 1 in the past (w >= -1); the
    factor 1.1 covers phantom dark energy down to w0 ~ -2 at low z.
    """
    return 1.1 * background.C_OVER_H0 * lc.z_max
