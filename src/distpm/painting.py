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
in blocks of at most ``MAX_BLOCK``, which bounds their temporaries. Only
reverse-mode differentiation (``jax.grad``, ``jax.vjp``) is supported through
them.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
from jax import lax

from distpm.ops.buffers import zeros_after
from distpm.ops.platform import HIGHEST


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
# The kernels go through the particles in blocks of at most MAX_BLOCK, one after
# the other, so that their per-particle temporaries (stencils, the (n, o, o, o)
# weight blocks of a deposit, gathered values: about 230 B per particle in a
# gradient's force) exist for at most MAX_BLOCK particles at once: a work area of
# at most about 0.5 GB however many particles a device holds. A device with fewer
# takes them in one block, with no loop: XLA's CPU backend runs a loop's kernels
# one after the other, and one pass is much faster there (the 128^3 gradient on
# 2 cores: 11 s in one block, 18-20 s in eight; benchmarks/pmwd_cpu.md).
MAX_BLOCK = 2**21


def _blocks(n: int) -> tuple[int, int]:
    """(number, size) of the blocks the kernels take ``n`` particles in."""
    count = max(1, -(-n // MAX_BLOCK))
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


_OUTSIDE = -8.0  # local cell coordinate of empty slots: their stencils miss the block


def _frame_cells(pos, mask, frame):
    """Local cell coordinates (n, 3) of positions [Mpc/h]; masked-out slots lie outside the
    block. frame: (layout, cell_size).

    The scatter of a deposit drops their (zero) mass instead of piling it
    onto one cell; their readout values are set to 0.
    """
    layout, cell_size = frame
    cells = layout.local_cells(layout.cell_coordinates(pos, cell_size))
    return jnp.where(mask[:, None], cells, _OUTSIDE)


def _position_cotangent(g_cells, mask, frame):
    """Cotangent of positions [Mpc/h] from that of their cells (n, 3): cells are
    positions / cell_size (up to a shift and the periodic wrap), masked slots have none."""
    _, cell_size = frame
    return jnp.where(mask[:, None], g_cells / jnp.asarray(cell_size, g_cells.dtype), 0)


def _deposit_blocks(padded, pos, mask, mass, order, frame):
    """Add masses (n,) or vectors (n, c), or one mass () for all, at positions ``pos`` into
    ``padded``, block by block."""
    n = pos.shape[0]
    count, size = _blocks(n)

    def add(padded, j):
        start, own = _rows(j, n, size)
        take = lambda x: lax.dynamic_slice_in_dim(x, start, size)  # noqa: E731
        m = take(mass) if mass.ndim else jnp.broadcast_to(mass, (size,))
        m = jnp.where(own.reshape(-1, *([1] * (m.ndim - 1))), m, 0)  # repeated rows add 0
        (fx, wx, _), (fy, wy, _), (fz, wz, _) = _stencils(
            _frame_cells(take(pos), take(mask), frame), order
        )
        blocks = _outer(wx, wy, wz)
        blocks = blocks.reshape(*blocks.shape, *([1] * (m.ndim - 1))) * m[:, None, None, None]
        return _scatter_windows(padded, jnp.stack([fx, fy, fz], axis=1), blocks), None

    return lax.scan(add, padded, jnp.arange(count))[0]


def _interpolate_blocks(padded, pos, mask, order, frame, weights=None, add_to=None):
    """Values (n, *c) of ``padded`` at positions ``pos`` (0 on masked slots), block by
    block; with ``weights`` (n, *c) or (), also sum_c weights * d value / d pos (n, 3) (else
    None).

    add_to: None or (base, column, scale) for a scalar field: instead of the
    values, return ``base`` (n, k) with scale * values added into its column
    ``column``, block by block (no (n,) array of values).
    Each block's cells are computed where they are used, so that no (n, 3) array of
    cells outlives the block (it would be as large as the positions).
    """
    n = pos.shape[0]
    count, size = _blocks(n)
    # made once the field to read is there: on one device the mask is constant
    zeros = lambda s: _varying_like(zeros_after(s, padded.dtype, padded), padded, pos)  # noqa: E731
    if add_to is None:
        out = (zeros((n, *padded.shape[3:])), None if weights is None else zeros((n, 3)))
    else:
        base, column, scale = add_to
        out = (_varying_like(base, padded, pos), None)

    def read(out, j):
        start, own = _rows(j, n, size)  # repeated rows are written again with the same values
        take = lambda x: lax.dynamic_slice_in_dim(x, start, size)  # noqa: E731
        mask_j = take(mask)
        # the cells made after the field: a loop over fields (the force's components) would
        # have XLA hoist the stencils out of it and keep each node's indices and weights for
        # the whole loop (about 40 arrays of n values), which its gathers then read from
        # memory; recomputed in each interpolation they cost less (benchmarks/pmwd_cpu.md)
        cells = _frame_cells(take(pos), mask_j, frame) + zeros_after((), pos.dtype, padded)
        value, grad = _interpolate_nodes(
            padded, _stencils(cells, order), order, weights is not None
        )
        value = jnp.where(mask_j.reshape(-1, *([1] * (value.ndim - 1))), value, 0)
        if add_to is not None:  # repeated rows add nothing the second time
            at = (start, column.astype(start.dtype))
            added = (
                lax.dynamic_slice(out[0], at, (size, 1)) + jnp.where(own, scale * value, 0)[:, None]
            )
            return (lax.dynamic_update_slice(out[0], added, at), None), None
        if weights is not None:
            if weights.ndim == 2:
                grad = jnp.einsum("nc,nca->na", take(weights), grad, precision=HIGHEST)
            else:  # per particle (n,) or one for all ()
                grad = (take(weights)[:, None] if weights.ndim else weights) * grad
            grad = _position_cotangent(grad, mask_j, frame)
        put = lambda o, g: lax.dynamic_update_slice_in_dim(o, g, start, 0)  # noqa: E731
        return jax.tree.map(put, out, (value, grad)), None

    return lax.scan(read, out, jnp.arange(count))[0]


# ---- the two local kernels and their adjoints --------------------------------
# pos: (n, 3) [Mpc/h]; mask: (n,) bool of valid slots; frame: (layout, cell_size).


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def deposit(padded, pos, mask, mass, order, frame):
    """Add masses (n,) or vectors (n, c) at positions ``pos`` into the padded block ``padded``."""
    return _deposit_blocks(padded, pos, mask, mass, order, frame)


def _deposit_fwd(padded, pos, mask, mass, order, frame):
    return deposit(padded, pos, mask, mass, order, frame), (pos, mask, mass)


def _deposit_bwd(order, frame, residuals, g_padded):
    pos, mask, mass = residuals
    value, g_pos = _interpolate_blocks(g_padded, pos, mask, order, frame, weights=mass)
    return g_padded, g_pos, None, value if mass.ndim else jnp.sum(value)


deposit.defvjp(_deposit_fwd, _deposit_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def interpolate(padded, pos, mask, order, frame):
    """Interpolate a padded block (X, Y, Z) or (X, Y, Z, c) at positions (n, 3) [Mpc/h]."""
    return _interpolate_blocks(padded, pos, mask, order, frame)[0]


def _interpolate_fwd(padded, pos, mask, order, frame):
    return interpolate(padded, pos, mask, order, frame), (padded, pos, mask)


def _interpolate_bwd(order, frame, residuals, g_values):
    padded, pos, mask = residuals
    zeros = zeros_after(padded.shape, padded.dtype, g_values)
    g_padded = _deposit_blocks(zeros, pos, mask, g_values, order, frame)
    _, g_pos = _interpolate_blocks(padded, pos, mask, order, frame, weights=g_values)
    return g_padded, g_pos, None


interpolate.defvjp(_interpolate_fwd, _interpolate_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def interpolate_add(padded, pos, mask, base, column, scale, order, frame):
    """``base`` (n, k) with ``scale`` times a padded scalar block (X, Y, Z) at positions
    (n, 3) [Mpc/h] added into its column ``column`` (int32, may be traced)."""
    return _interpolate_blocks(padded, pos, mask, order, frame, add_to=(base, column, scale))[0]


def _interpolate_add_fwd(padded, pos, mask, base, column, scale, order, frame):
    out = interpolate_add(padded, pos, mask, base, column, scale, order, frame)
    return out, (padded, pos, mask, column, scale)


def _interpolate_add_bwd(order, frame, residuals, g_out):
    padded, pos, mask, column, scale = residuals
    g_values = lax.dynamic_index_in_dim(g_out, column, axis=1, keepdims=False)
    zeros = zeros_after(padded.shape, padded.dtype, g_values)
    g_padded = _deposit_blocks(zeros, pos, mask, scale * g_values, order, frame)
    values, g_pos = _interpolate_blocks(padded, pos, mask, order, frame, weights=scale * g_values)
    g_scale = jnp.sum(values * g_values)
    return g_padded, g_pos, None, g_out, None, g_scale


interpolate_add.defvjp(_interpolate_add_fwd, _interpolate_add_bwd)


# ---- public: paint and readout on the layout's local block -------------------


def _valid(pos, mask):
    """The mask of valid slots: all of them when ``mask`` is None."""
    return jnp.ones(pos.shape[:1], bool) if mask is None else mask


def paint(pos, mass, layout, cell_size, order: int, mask=None):
    """Assign particle masses to the local mesh block.

    pos: (n, 3) [Mpc/h] positions of the particles this device owns.
    mass: scalar or (n,) mass per particle (any unit; the mesh holds the
        same unit per cell). mask: optional (n,) bool of valid slots; the
        others paint nothing.
    cell_size: [Mpc/h] 3 Python numbers (static). order: 2 (CIC) or 3 (TSC).
    Returns the local block ``layout.local_shape``.
    """
    low, high = halo_widths(order)
    shape = tuple(n + low + high for n in layout.local_shape)
    mask = _valid(pos, mask)
    mass = jnp.asarray(mass, pos.dtype)  # one mass for all is not spread over the slots
    if mass.ndim:
        mass = jnp.where(mask, mass, 0)
    pos, mass = layout.varying(pos, mass)
    frame = (layout, tuple(cell_size))
    zeros = layout.varying(zeros_after(shape, pos.dtype, pos))
    padded = deposit(zeros, pos, mask, mass, order, frame)
    return layout.halo_add(padded, low, high)


def readout(field, pos, layout, cell_size, order: int, mask=None, add_to=None):
    """Interpolate a local field block at particle positions.

    field: local block (nx, ny, nz) or (nx, ny, nz, c).
    pos: (n, 3) [Mpc/h] positions of the particles this device owns.
    mask: optional (n,) bool of valid slots; the others read 0.
    add_to: optional (base, column, scale) for a scalar field: return
        ``base`` (n, k) with scale * the values added into its column
        ``column`` (an int, may be traced), e.g. a kick of the momenta by one
        force component; no (n,) array of values is made (4 B per slot in
        float32), and XLA updates ``base`` in place when nothing else reads it.
    Returns (n,) or (n, c), or base's shape with ``add_to``.
    """
    low, high = halo_widths(order)
    padded = layout.halo_fill(field, low, high)
    padded, pos = layout.varying(padded, pos)
    frame = (layout, tuple(cell_size))
    mask = _valid(pos, mask)
    if add_to is None:
        return interpolate(padded, pos, mask, order, frame)
    base, column, scale = add_to
    if field.ndim != 3 or base.ndim != 2 or base.shape[0] != pos.shape[0]:
        raise ValueError(
            f"add_to needs a scalar field and an (n, k) base for n = {pos.shape[0]} particles, "
            f"got a field of shape {field.shape} and a base of shape {base.shape}"
        )
    if base.dtype != field.dtype:
        raise ValueError(f"add_to's base is {base.dtype}, the field {field.dtype}: make them one")
    if isinstance(column, int) and not 0 <= column < base.shape[1]:
        raise ValueError(f"add_to's column {column} is not one of the base's {base.shape[1]}")
    # typed per device like the result, so that their cotangents are summed over devices
    base = _varying_like(base, padded, pos)
    scale = _varying_like(jnp.asarray(scale, field.dtype), padded, pos)
    column = jnp.asarray(column, jnp.int32)
    return interpolate_add(padded, pos, mask, base, column, scale, order, frame)
