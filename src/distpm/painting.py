"""Mass assignment (paint) and interpolation (readout) on a local block.

Conventions: mesh node (i, j, l) sits at position (i, j, l) * cell_size;
positions are global [Mpc/h] in [0, box_size). CIC touches the 2 nearest
nodes per axis, TSC the 3 nearest. Painting writes into the local block
padded by a halo of ``order - 1`` cells on every side, folds the z halo
locally (z is never split) and lets the layout add the x and y halos into
the neighbours; readout first has the layout fill the x and y halos from
the neighbours. No collectives here: those live in ``distpm.parallel``.

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


def _stencils(pos, grid, cell_size, order):
    """Per-axis stencils of positions [Mpc/h]; first indices in padded-block coordinates.

    Positions are wrapped periodically in global cell units first, so that a
    position that rounds to the box size (or lies outside the box) lands on
    its periodic image instead of outside the block.
    """
    halo = order - 1
    out = []
    for a in range(3):
        n_global, start = grid[a]
        x = jnp.mod(pos[:, a] / cell_size[a], n_global)
        x = jnp.where(x >= n_global, x - n_global, x)
        first, w, dw = _stencil(x - start, order)
        out.append((first + halo, w, dw / cell_size[a]))
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def deposit(pos, mass, shape, grid, cell_size, order):
    """Deposit masses (n,) or vectors (n, c) into a padded block of ``shape``."""
    (fx, wx, _), (fy, wy, _), (fz, wz, _) = _stencils(pos, grid, cell_size, order)
    first = jnp.stack([fx, fy, fz], axis=1)
    blocks = _outer(wx, wy, wz)
    blocks = blocks.reshape(*blocks.shape, *([1] * (mass.ndim - 1))) * mass[:, None, None, None]
    return _scatter_windows(shape, first, blocks)


def _deposit_fwd(pos, mass, shape, grid, cell_size, order):
    return deposit(pos, mass, shape, grid, cell_size, order), (pos, mass)


def _deposit_bwd(shape, grid, cell_size, order, residuals, g_padded):
    pos, mass = residuals
    value, grad = _interpolate_with_gradient(g_padded, pos, grid, cell_size, order)
    if mass.ndim == 1:
        return mass[:, None] * grad, value
    return jnp.einsum("nc,nca->na", mass, grad), value


deposit.defvjp(_deposit_fwd, _deposit_bwd)


def _interpolate_with_gradient(padded, pos, grid, cell_size, order):
    """Interpolated values (n, *c) and their position gradients (n, *c, 3)."""
    stencils = _stencils(pos, grid, cell_size, order)
    return _interpolate_nodes(padded, stencils, order, with_gradient=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def interpolate(padded, pos, grid, cell_size, order):
    """Interpolate a padded block (X, Y, Z) or (X, Y, Z, c) at positions (n, 3)."""
    stencils = _stencils(pos, grid, cell_size, order)
    return _interpolate_nodes(padded, stencils, order, with_gradient=False)[0]


def _interpolate_fwd(padded, pos, grid, cell_size, order):
    return interpolate(padded, pos, grid, cell_size, order), (padded, pos)


def _interpolate_bwd(grid, cell_size, order, residuals, g_values):
    padded, pos = residuals
    g_padded = deposit(pos, g_values, padded.shape, grid, cell_size, order)
    _, grad = _interpolate_with_gradient(padded, pos, grid, cell_size, order)
    if g_values.ndim == 1:
        return g_padded, g_values[:, None] * grad
    return g_padded, jnp.einsum("nc,nca->na", g_values, grad)


interpolate.defvjp(_interpolate_fwd, _interpolate_bwd)


# ---- local z halo (z is never split over devices) -----------------------------


def _fold_z(padded, halo):
    """Add the z halo of a block padded in z onto the periodic cells; drop it."""
    if halo == 0:
        return padded
    nz = padded.shape[2] - 2 * halo
    core = lax.slice_in_dim(padded, halo, halo + nz, axis=2)
    low = lax.slice_in_dim(padded, 0, halo, axis=2)
    high = lax.slice_in_dim(padded, halo + nz, nz + 2 * halo, axis=2)
    core = core.at[:, :, :halo].add(high)
    return core.at[:, :, nz - halo :].add(low)


def _pad_z(block, halo):
    pad = [(0, 0), (0, 0), (halo, halo)] + [(0, 0)] * (block.ndim - 3)
    return jnp.pad(block, pad, mode="wrap")


# ---- public: paint and readout on the layout's local block -------------------


def _grid(layout):
    """Per axis: (global cells, first global cell of the local block)."""
    return tuple(zip(layout.mesh_shape, layout.local_origin, strict=True))


def paint(pos, mass, layout, cell_size, order: int):
    """Assign particle masses to the local mesh block.

    pos: (n, 3) [Mpc/h] positions of particles in this device's block
        (taken periodically: a position outside [0, L) paints its image).
    mass: scalar or (n,) mass per particle (any unit; the mesh holds the
        same unit per cell).
    cell_size: [Mpc/h] 3 numbers. order: 2 (CIC) or 3 (TSC).
    Returns the local block (nx, ny, nz).
    """
    halo = order - 1
    nx, ny, nz = layout.local_shape
    shape = (nx + 2 * halo, ny + 2 * halo, nz + 2 * halo)
    mass = jnp.broadcast_to(jnp.asarray(mass, pos.dtype), pos.shape[:1])
    padded = deposit(pos, mass, shape, _grid(layout), tuple(cell_size), order)
    return layout.halo_add(_fold_z(padded, halo), halo)


def readout(field, pos, layout, cell_size, order: int):
    """Interpolate a local field block at particle positions.

    field: (nx, ny, nz) or (nx, ny, nz, c) local block.
    pos: (n, 3) [Mpc/h] positions in this device's block (taken periodically).
    Returns (n,) or (n, c).
    """
    halo = order - 1
    padded = _pad_z(layout.halo_fill(field, halo), halo)
    return interpolate(padded, pos, _grid(layout), tuple(cell_size), order)
