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
interpolation is one gather per stencil node. Both go through the particles
in a few blocks, one after the other, which keeps their temporaries small
(see ``BLOCKS``). Only reverse-mode differentiation (``jax.grad``,
``jax.vjp``) is supported through them.
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


def _scatter_windows(operand, first, blocks):
    """Add (n, o, o, o, *c) blocks into ``operand`` at ``first`` (n, 3)."""
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
    return lax.scatter_add(operand, first, blocks, dims, mode=lax.GatherScatterMode.FILL_OR_DROP)


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


# ---- particles in blocks ------------------------------------------------------
# The kernels go through the particles in up to BLOCKS blocks of at least
# MIN_BLOCK, one after the other, so that the per-particle stencil arrays (the
# (n, o, o, o) weight blocks of a deposit: 32 B per particle for CIC; the o^3
# gathered values of an interpolation: 96 B for a 3-vector) never exist for
# all particles at once. MIN_BLOCK is small, so that a device's share of a small
# mesh is split too and the temporaries shrink with the particles per device.
BLOCKS = 8
MIN_BLOCK = 2**12


def _blocks(n: int) -> tuple[int, int]:
    """(number, size) of the blocks the kernels take ``n`` particles in."""
    count = max(1, min(BLOCKS, n // MIN_BLOCK))
    return count, -(-n // count)


def _rows(j, n: int, size: int):
    """First row of block j, and which of its rows are its own: the last block
    starts early enough to stay inside the arrays and repeats rows of the one before."""
    start = jnp.minimum(j * size, n - size)
    return start, start + jnp.arange(size) >= j * size


def _varying_like(x, *templates):
    """``x`` typed as varying over the devices any of ``templates`` varies over
    (inside ``shard_map``; a no-op outside)."""
    axes = set().union(*(jax.typeof(t).manual_axis_type.varying for t in templates))
    axes = tuple(sorted(axes - set(jax.typeof(x).manual_axis_type.varying)))
    return lax.pcast(x, axes, to="varying") if axes else x


def _deposit_blocks(padded, cells, mass, order):
    """Add masses (n,) or vectors (n, c) at ``cells`` into ``padded``, block by block."""
    n = cells.shape[0]
    count, size = _blocks(n)

    def add(padded, j):
        start, own = _rows(j, n, size)
        c = lax.dynamic_slice_in_dim(cells, start, size)
        m = lax.dynamic_slice_in_dim(mass, start, size)
        m = jnp.where(own.reshape(-1, *([1] * (m.ndim - 1))), m, 0)  # repeated rows add 0
        (fx, wx, _), (fy, wy, _), (fz, wz, _) = _stencils(c, order)
        blocks = _outer(wx, wy, wz)
        blocks = blocks.reshape(*blocks.shape, *([1] * (m.ndim - 1))) * m[:, None, None, None]
        return _scatter_windows(padded, jnp.stack([fx, fy, fz], axis=1), blocks), None

    return lax.scan(add, padded, jnp.arange(count))[0]


def _interpolate_blocks(padded, cells, order, weights=None):
    """Values (n, *c) of ``padded`` at ``cells``, block by block; with ``weights``
    (n, *c), also sum_c weights * d value / d cells (n, 3) (else None)."""
    n = cells.shape[0]
    count, size = _blocks(n)
    zeros = lambda s: _varying_like(jnp.zeros(s, padded.dtype), padded, cells)  # noqa: E731
    out = (zeros((n, *padded.shape[3:])), None if weights is None else zeros((n, 3)))

    def read(out, j):
        start, _ = _rows(j, n, size)  # repeated rows are written again with the same values
        take = lambda x: lax.dynamic_slice_in_dim(x, start, size)  # noqa: E731
        value, grad = _interpolate_nodes(
            padded, _stencils(take(cells), order), order, weights is not None
        )
        if weights is not None:
            w = take(weights)
            grad = w[:, None] * grad if w.ndim == 1 else jnp.einsum("nc,nca->na", w, grad)
        put = lambda o, g: lax.dynamic_update_slice_in_dim(o, g, start, 0)  # noqa: E731
        return jax.tree.map(put, out, (value, grad)), None

    return lax.scan(read, out, jnp.arange(count))[0]


# ---- the two local kernels and their adjoints --------------------------------
# cells: (n, 3) local cell coordinates; derivatives are per cell unit.


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def deposit(padded, cells, mass, order):
    """Add masses (n,) or vectors (n, c) at ``cells`` into the padded block ``padded``."""
    return _deposit_blocks(padded, cells, mass, order)


def _deposit_fwd(padded, cells, mass, order):
    return deposit(padded, cells, mass, order), (cells, mass)


def _deposit_bwd(order, residuals, g_padded):
    cells, mass = residuals
    value, g_cells = _interpolate_blocks(g_padded, cells, order, weights=mass)
    return g_padded, g_cells, value


deposit.defvjp(_deposit_fwd, _deposit_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def interpolate(padded, cells, order):
    """Interpolate a padded block (X, Y, Z) or (X, Y, Z, c) at cell coordinates (n, 3)."""
    return _interpolate_blocks(padded, cells, order)[0]


def _interpolate_fwd(padded, cells, order):
    return interpolate(padded, cells, order), (padded, cells)


def _interpolate_bwd(order, residuals, g_values):
    padded, cells = residuals
    g_padded = _deposit_blocks(jnp.zeros_like(padded), cells, g_values, order)
    _, g_cells = _interpolate_blocks(padded, cells, order, weights=g_values)
    return g_padded, g_cells


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
    padded = deposit(layout.varying(jnp.zeros(shape, pos.dtype)), cells, mass, order)
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
