"""Mass assignment (paint) and interpolation (readout) on a local block.

Conventions: mesh node (i, j, l) sits at position (i, j, l) * cell_size;
positions are global [Mpc/h]. A device paints the particles it owns (those
inside its block, see :mod:`distpm.parallel.migrate`). CIC touches the 2
nearest nodes per axis, TSC the 3 nearest, so a block is padded by a halo
of ``low`` cells before and ``high`` after it on every axis (CIC 0 and 1,
TSC 1 and 2); the layout adds the halo into the neighbours after painting
and fills it from them before readout. No collectives here: those live in
``distpm.parallel``.

Paint and readout with the same kernel are adjoint:
``<paint(x, m), f> = <m, readout(f, x)>``. Their derivatives are written
out (custom VJPs) so that each uses the fastest XLA primitive: a deposit is
one windowed scatter-add of each particle's (order)^3 block; an
interpolation is one gather per stencil node. Only reverse-mode
differentiation (``jax.grad``, ``jax.vjp``) is supported through them.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax


def _stencil(x, order: int):
    """First node index, weights and weight derivatives along one axis.

    x: (n,) positions in cell units. Returns (first (n,) int32, w (n, order),
    dw (n, order)) with dw = d w / d x.
    """
    if order == 2:  # cloud in cell
        i0 = jnp.floor(x)
        d = x - i0
        w = [1 - d, d]
        dw = [-jnp.ones_like(d), jnp.ones_like(d)]
        first = i0
    elif order == 3:  # triangular shaped cloud
        i0 = jnp.floor(x + 0.5)
        d = x - i0
        w = [0.5 * (0.5 - d) ** 2, 0.75 - d**2, 0.5 * (0.5 + d) ** 2]
        dw = [d - 0.5, -2 * d, 0.5 + d]
        first = i0 - 1
    else:
        raise ValueError(f"paint order must be 2 (cic) or 3 (tsc), got {order}")
    return first.astype(jnp.int32), jnp.stack(w, -1), jnp.stack(dw, -1)


def halo_widths(order: int) -> tuple[int, int]:
    """Cells a block's stencils reach before and after it: CIC (0, 1), TSC (1, 2)."""
    return order - 2, order - 1


def _stencils(cells, order):
    """Per-axis stencils of local cell coordinates (n, 3), first nodes in padded-block indices.

    Owned particles have coordinates in [0, n) per axis (exactly: see
    :meth:`distpm.parallel.Layout.owner`), so their stencils stay inside
    the block padded by :func:`halo_widths`.
    """
    low, _ = halo_widths(order)
    out = []
    for a in range(3):
        first, w, dw = _stencil(cells[:, a], order)
        out.append((first + low, w, dw))
    return out


def _outer(wx, wy, wz):
    """(n, o, o, o) products of per-axis weights."""
    return wx[:, :, None, None] * wy[:, None, :, None] * wz[:, None, None, :]


def _scatter_windows(shape, first, blocks):
    """Add (n, o, o, o, *c) blocks into a zero array of ``shape`` at ``first`` (n, 3)."""
    window_dims = tuple(range(1, blocks.ndim))
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=window_dims,
        inserted_window_dims=(),
        scatter_dims_to_operand_dims=(0, 1, 2),
    )
    if blocks.ndim == 5:  # vector values: the component axis is a full window
        first = jnp.concatenate([first, jnp.zeros_like(first[:, :1])], axis=1)
        dims = lax.ScatterDimensionNumbers(
            update_window_dims=window_dims,
            inserted_window_dims=(),
            scatter_dims_to_operand_dims=(0, 1, 2, 3),
        )
    zeros = jnp.zeros(shape, blocks.dtype)
    return lax.scatter_add(zeros, first, blocks, dims, mode=lax.GatherScatterMode.FILL_OR_DROP)


def _interpolate_nodes(padded, stencils, order, with_gradient):
    """Weighted sums over the stencil nodes, accumulated node by node.

    Returns the interpolated values (n, *c) and, with ``with_gradient``,
    their position gradients (n, *c, 3).
    """
    (fx, wx, dx), (fy, wy, dy), (fz, wz, dz) = stencils
    nx, ny, nz = padded.shape[:3]
    flat = padded.reshape(nx * ny * nz, *padded.shape[3:])
    extra = (1,) * (padded.ndim - 3)

    def col(w, j):
        return w[:, j].reshape(-1, *extra)

    value = 0.0
    grad = [0.0, 0.0, 0.0]
    for a, b, c in itertools.product(range(order), repeat=3):
        v = flat[((fx + a) * ny + (fy + b)) * nz + (fz + c)]
        value = value + v * (col(wx, a) * col(wy, b) * col(wz, c))
        if with_gradient:
            grad[0] = grad[0] + v * (col(dx, a) * col(wy, b) * col(wz, c))
            grad[1] = grad[1] + v * (col(wx, a) * col(dy, b) * col(wz, c))
            grad[2] = grad[2] + v * (col(wx, a) * col(wy, b) * col(dz, c))
    if not with_gradient:
        return value, None
    return value, jnp.stack(grad, axis=-1)


# ---- the two local kernels and their adjoints --------------------------------
# cells: (n, 3) local cell coordinates; derivatives are per cell unit.


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def deposit(cells, mass, shape, order):
    """Deposit masses (n,) or vectors (n, c) into a padded block of ``shape``."""
    (fx, wx, _), (fy, wy, _), (fz, wz, _) = _stencils(cells, order)
    first = jnp.stack([fx, fy, fz], axis=1)
    blocks = _outer(wx, wy, wz)
    blocks = blocks.reshape(*blocks.shape, *([1] * (mass.ndim - 1))) * mass[:, None, None, None]
    return _scatter_windows(shape, first, blocks)


def _deposit_fwd(cells, mass, shape, order):
    return deposit(cells, mass, shape, order), (cells, mass)


def _deposit_bwd(shape, order, residuals, g_padded):
    cells, mass = residuals
    value, grad = _interpolate_nodes(g_padded, _stencils(cells, order), order, True)
    if mass.ndim == 1:
        return mass[:, None] * grad, value
    return jnp.einsum("nc,nca->na", mass, grad), value


deposit.defvjp(_deposit_fwd, _deposit_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def interpolate(padded, cells, order):
    """Interpolate a padded block (X, Y, Z) or (X, Y, Z, c) at cell coordinates (n, 3)."""
    return _interpolate_nodes(padded, _stencils(cells, order), order, False)[0]


def _interpolate_fwd(padded, cells, order):
    return interpolate(padded, cells, order), (padded, cells)


def _interpolate_bwd(order, residuals, g_values):
    padded, cells = residuals
    g_padded = deposit(cells, g_values, padded.shape, order)
    _, grad = _interpolate_nodes(padded, _stencils(cells, order), order, True)
    if g_values.ndim == 1:
        return g_padded, g_values[:, None] * grad
    return g_padded, jnp.einsum("nc,nca->na", g_values, grad)


interpolate.defvjp(_interpolate_fwd, _interpolate_bwd)


# ---- public: paint and readout on the layout's local block -------------------


_OUTSIDE = -8.0  # local cell coordinate of empty slots: their stencils miss the block


def _local_cells(pos, mask, layout, cell_size):
    """Local cell coordinates of positions [Mpc/h]; masked-out slots lie outside the block.

    The scatter of a deposit drops their (zero) mass instead of piling it
    onto one cell; their readout values are discarded by the caller.
    """
    cells = layout.local_cells(layout.cell_coordinates(pos, cell_size))
    if mask is not None:
        cells = jnp.where(mask[:, None], cells, _OUTSIDE)
    return cells


def paint(pos, mass, layout, cell_size, order: int, mask=None):
    """Assign particle masses to the local mesh block.

    pos: (n, 3) [Mpc/h] positions of the particles this device owns.
    mass: scalar or (n,) mass per particle (any unit; the mesh holds the
        same unit per cell). mask: optional (n,) bool of valid slots; the
        others paint nothing.
    cell_size: [Mpc/h] 3 numbers. order: 2 (CIC) or 3 (TSC).
    Returns the local block ``layout.local_shape``.
    """
    low, high = halo_widths(order)
    shape = tuple(n + low + high for n in layout.local_shape)
    mass = jnp.broadcast_to(jnp.asarray(mass, pos.dtype), pos.shape[:1])
    if mask is not None:
        mass = jnp.where(mask, mass, 0)
    cells, mass = layout.varying(_local_cells(pos, mask, layout, cell_size), mass)
    padded = deposit(cells, mass, shape, order)
    return layout.halo_add(padded, low, high)


def readout(field, pos, layout, cell_size, order: int, mask=None):
    """Interpolate a local field block at particle positions.

    field: local block (nx, ny, nz) or (nx, ny, nz, c).
    pos: (n, 3) [Mpc/h] positions of the particles this device owns.
    mask: optional (n,) bool of valid slots; the others read 0.
    Returns (n,) or (n, c).
    """
    low, high = halo_widths(order)
    padded = layout.halo_fill(field, low, high)
    padded, cells = layout.varying(padded, _local_cells(pos, mask, layout, cell_size))
    values = interpolate(padded, cells, order)
    if mask is not None:
        values = jnp.where(mask.reshape(-1, *([1] * (values.ndim - 1))), values, 0)
    return values
