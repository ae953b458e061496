"""The layout of fields and particles over the device grid, with its operations.

Real space: a field of global shape (Nx, Ny, Nz) is split as pencils along
z over the device grid (px, py) with mesh axes ("x", "y"): device (ix, iy)
holds the block of shape (Nx/px, Ny/py, Nz) starting at cell
(ix Nx/px, iy Ny/py, 0). As a global jax array the field has sharding
``P("x", "y")``.

k-space: the local block of :meth:`Layout.rfft3d` has shape
(Nx, Ny/px, Kz'/py) with axes (kx, ky, kz) (see :mod:`distpm.parallel.fft`).
Kernels must not assume it: they take their wavenumbers from
:meth:`Layout.wavenumbers` and mode weights from
:meth:`Layout.hermitian_weights`, both broadcastable to the local k block.

Particles: device (ix, iy) owns the particles whose positions fall in its
real-space block (Eulerian ownership); see :mod:`distpm.parallel.migrate`.

The methods run on local blocks inside ``shard_map`` over
:func:`distpm.parallel.devices.device_mesh` (also on the 1x1 grid).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from distpm.parallel import fft, halo
from distpm.parallel.devices import AXES


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each part of a field lives, and the collectives that use it.

    mesh_shape: global shape of the field. grid: device grid (px, py).
    """

    mesh_shape: tuple[int, int, int]
    grid: tuple[int, int] = (1, 1)

    @property
    def n_devices(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def local_shape(self) -> tuple[int, int, int]:
        """Shape of this device's real-space block (without halo)."""
        (nx, ny, nz), (px, py) = self.mesh_shape, self.grid
        return nx // px, ny // py, nz

    def grid_index(self):
        """(ix, iy): this device's position on the grid (python ints on axes of size 1)."""
        return tuple(
            0 if p == 1 else lax.axis_index(name) for p, name in zip(self.grid, AXES, strict=True)
        )

    def device_index(self):
        """Linear index ix * py + iy of this device (the order of ``P(("x", "y"))`` blocks)."""
        ix, iy = self.grid_index()
        return ix * self.grid[1] + iy

    @property
    def local_origin(self):
        """Global cell index of this device's block's first cell, per axis."""
        ix, iy = self.grid_index()
        nx, ny, _ = self.local_shape
        return ix * nx, iy * ny, 0

    # ---- positions -----------------------------------------------------------
    def cell_coordinates(self, pos, cell_size):
        """Positions [Mpc/h] (n, 3) in global cell units, wrapped into [0, N) per axis."""
        n = jnp.asarray(self.mesh_shape, pos.dtype)
        x = jnp.mod(pos / jnp.asarray(cell_size, pos.dtype), n)
        return jnp.where(x >= n, x - n, x)

    def owner(self, cells):
        """(ix, iy) int32 of the device whose block holds each point.

        cells: global cell coordinates from :meth:`cell_coordinates`. The
        owner is found from the integer cell index, so that a point's
        coordinates relative to its owner's block (:meth:`local_cells`) are
        exactly inside [0, n): the subtraction of the block origin is exact.
        """
        nx, ny, _ = self.local_shape
        index = jnp.floor(cells[:, :2]).astype(jnp.int32)
        return index[:, 0] // nx, index[:, 1] // ny

    def local_cells(self, cells):
        """Cell coordinates relative to this device's block (in [0, n) for owned points)."""
        origin = jnp.stack([jnp.asarray(o, cells.dtype) for o in self.local_origin])
        return cells - origin

    # ---- FFTs ---------------------------------------------------------------
    def rfft3d(self, x):
        """Forward real-to-complex 3-D FFT of a local block (unnormalised)."""
        return fft.rfft3d(x, self.mesh_shape, self.grid)

    def irfft3d(self, xk):
        """Inverse of :meth:`rfft3d` (normalised by 1/N, real output)."""
        return fft.irfft3d(xk, self.mesh_shape, self.grid)

    @property
    def kspace_shape(self) -> tuple[int, int, int]:
        return fft.kspace_shape(self.mesh_shape, self.grid)

    def _local_k(self, table, axis):
        """Slice a global 1-D k-space table to this device's part, shaped for axis."""
        size = self.kspace_shape[axis]
        table = jnp.asarray(table)
        if axis > 0 and self.grid[axis - 1] > 1:  # split: ky over "x", kz over "y"
            index = self.grid_index()[axis - 1]
            table = lax.dynamic_slice_in_dim(table, index * size, size)
        return table.reshape([-1 if i == axis else 1 for i in range(3)])

    def wavenumbers(self, box_size, dtype) -> list:
        """[h/Mpc] local (kx, ky, kz) of the k-space block, broadcastable to it."""
        tables = fft.global_wavenumbers(self.mesh_shape, box_size, self.grid[1])
        return [self._local_k(t.astype(dtype), a) for a, t in enumerate(tables)]

    def hermitian_weights(self, dtype):
        """Full-space modes each stored mode stands for (1 or 2; 0 for padding), (1, 1, kz)."""
        w = fft.global_hermitian_weights(self.mesh_shape[2], self.grid[1])
        return self._local_k(w.astype(dtype), 2)

    # ---- halo ---------------------------------------------------------------
    def halo_add(self, padded, low: int, high: int):
        """Add the halo of a painted block (low cells before, high after) into its owners."""
        return halo.add_halo(padded, low, high, self.grid)

    def halo_fill(self, block, low: int, high: int):
        """Pad a block on every axis with ``low``/``high`` cells of its neighbours."""
        return halo.fill_halo(block, low, high, self.grid)

    # ---- per-device values ---------------------------------------------------
    @staticmethod
    def varying(*xs):
        """Mark arrays as (possibly) different on every device, if they are not yet.

        Values computed without device-dependent input (a constant mask, a
        broadcast mass) are typed by ``shard_map`` as the same on every
        device. Passing them through this before a hand-written VJP (paint,
        readout) lets JAX's own transpose sum their cotangents over the
        devices, as the math requires; no data moves in the forward pass.
        Outside ``shard_map`` (a 1x1 block used directly) it returns its inputs.
        """
        bound = jax.sharding.get_abstract_mesh().manual_axes
        out = []
        for x in xs:
            have = jax.typeof(x).manual_axis_type.varying
            missing = tuple(a for a in AXES if a in bound and a not in have)
            out.append(lax.pcast(x, missing, to="varying") if missing else x)
        return out[0] if len(out) == 1 else tuple(out)

    # ---- reductions (also mark the result as the same on every device) -------
    def device_sum(self, x):
        """Element-wise sum of an array over all devices."""
        return lax.psum(x, AXES)

    def device_max(self, x):
        """Element-wise maximum of an array (or a pytree of arrays) over all devices."""
        return lax.pmax(x, AXES)

    def gather_all(self, x):
        """Every device's ``x`` (n, ...), concatenated in device order: (n_devices * n, ...)."""
        return lax.all_gather(x, AXES, axis=0, tiled=True)


def global_wavenumber_grid(shape, box_size) -> np.ndarray:
    """[h/Mpc] |k| of the whole unpadded rfft grid (host numpy), for static bin counts."""
    kx, ky, kz = fft.global_wavenumbers(shape, box_size, 1)
    return np.sqrt(kx[:, None, None] ** 2 + ky[None, :, None] ** 2 + kz[None, None, :] ** 2)
