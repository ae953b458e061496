"""Mass assignment and readout: adjointness, mass conservation, periodic halo."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from distpm import painting
from distpm.painting import paint, readout
from distpm.parallel import Layout

SHAPE = (8, 6, 10)
BOX = (16.0, 12.0, 25.0)
CELL = tuple(b / n for b, n in zip(BOX, SHAPE, strict=True))
ORDERS = {"cic": 2, "tsc": 3}


@pytest.fixture(params=["one block", "blocks"])
def blocks(request, monkeypatch):
    """Paint and readout on all particles at once, or in blocks of a few particles
    (the last one overlapping the one before), as they take more than MAX_BLOCK."""
    if request.param == "blocks":
        monkeypatch.setattr(painting, "MAX_BLOCK", 40)
    return request.param


def _positions(n, seed=0):
    """Random positions plus particles on the box faces, edges and corners."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, 1, (n, 3)) * BOX
    edge_values = [0.0, 1e-6, 0.5, 1.0 - 1e-6]
    corners = np.array(list(itertools.product(edge_values, repeat=3))) * BOX
    return np.concatenate([pos, corners]).astype(np.float32)


def _numpy_paint(pos, mass, order):
    """Independent reference: loop over the stencil, wrap every index periodically."""
    out = np.zeros(SHAPE)
    cells = pos / CELL
    for p, m in zip(cells.astype(np.float64), mass, strict=True):
        stencils = []
        for x in p:
            if order == 2:
                i0 = int(np.floor(x))
                d = x - i0
                stencils.append([(i0, 1 - d), (i0 + 1, d)])
            else:
                i0 = int(np.floor(x + 0.5))
                d = x - i0
                stencils.append(
                    [
                        (i0 - 1, 0.5 * (0.5 - d) ** 2),
                        (i0, 0.75 - d * d),
                        (i0 + 1, 0.5 * (0.5 + d) ** 2),
                    ]
                )
        for (i, wi), (j, wj), (k, wk) in itertools.product(*stencils):
            out[i % SHAPE[0], j % SHAPE[1], k % SHAPE[2]] += m * wi * wj * wk
    return out


@pytest.mark.parametrize("kind", ORDERS)
def test_paint_matches_independent_reference(kind, blocks):
    pos = _positions(203)
    mass = np.random.default_rng(1).uniform(0.5, 2.0, len(pos)).astype(np.float32)
    mesh = paint(jnp.asarray(pos), jnp.asarray(mass), Layout(SHAPE), CELL, ORDERS[kind])
    np.testing.assert_allclose(mesh, _numpy_paint(pos, mass, ORDERS[kind]), rtol=0, atol=1e-5)
    np.testing.assert_allclose(float(mesh.sum()), mass.sum(), rtol=1e-6)


@pytest.mark.parametrize("kind", ORDERS)
def test_paint_and_readout_are_adjoint(kind, blocks):
    pos = jnp.asarray(_positions(500, seed=2))
    layout, order = Layout(SHAPE), ORDERS[kind]
    key1, key2 = jax.random.split(jax.random.key(3))
    mass = jax.random.normal(key1, pos.shape[:1])
    field = jax.random.normal(key2, SHAPE)
    lhs = jnp.vdot(paint(pos, mass, layout, CELL, order), field)
    rhs = jnp.vdot(mass, readout(field, pos, layout, CELL, order))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5)


@pytest.mark.parametrize("kind", ORDERS)
def test_readout_of_vector_field_matches_components(kind, blocks):
    pos = jnp.asarray(_positions(50, seed=4))
    layout, order = Layout(SHAPE), ORDERS[kind]
    field = jax.random.normal(jax.random.key(5), (*SHAPE, 3))
    together = readout(field, pos, layout, CELL, order)
    for c in range(3):
        np.testing.assert_allclose(
            together[:, c], readout(field[..., c], pos, layout, CELL, order), rtol=1e-6, atol=1e-6
        )


@pytest.mark.parametrize("kind", ORDERS)
def test_uniform_lattice_paints_uniform_density(kind):
    grid = np.stack(np.meshgrid(*[np.arange(n) + 0.5 for n in SHAPE], indexing="ij"), -1)
    pos = jnp.asarray((grid.reshape(-1, 3) * CELL).astype(np.float32))
    mesh = paint(pos, 1.0, Layout(SHAPE), CELL, ORDERS[kind])
    np.testing.assert_allclose(mesh, 1.0, atol=1e-6)
    np.testing.assert_allclose(
        readout(mesh, pos, Layout(SHAPE), CELL, ORDERS[kind]), 1.0, atol=1e-6
    )


@pytest.mark.parametrize("kind", ORDERS)
def test_custom_vjps_match_finite_differences(x64, kind, blocks):
    """Gradients of paint and readout w.r.t. positions, masses and the field, with a
    third of the slots masked out (they have no gradient)."""
    layout, order = Layout(SHAPE), ORDERS[kind]
    rng = np.random.default_rng(6)
    pos = jnp.asarray(rng.uniform(0.1, 0.9, (43, 3)) * BOX)
    mass = jnp.asarray(rng.uniform(0.5, 2.0, 43))
    mask = jnp.asarray(rng.uniform(size=43) > 1 / 3)
    field = jnp.asarray(rng.normal(size=(*SHAPE, 3)))
    probe = jnp.asarray(rng.normal(size=SHAPE))

    def scalar(pos, mass, field):
        painted = paint(pos, mass, layout, CELL, order, mask=mask)
        values = readout(field, pos, layout, CELL, order, mask=mask)
        return jnp.vdot(painted**2, probe) + jnp.sum(mass[:, None] * values**2)

    grads = jax.grad(scalar, argnums=(0, 1, 2))(pos, mass, field)
    assert not np.any(np.asarray(grads[0])[~np.asarray(mask)])
    assert np.all(np.any(np.asarray(grads[0])[np.asarray(mask)] != 0, axis=1))
    eps = 1e-6
    for i, x in enumerate((pos, mass, field)):
        direction = jnp.asarray(rng.normal(size=x.shape))
        args = [pos, mass, field]
        args[i] = x + eps * direction
        plus = scalar(*args)
        args[i] = x - eps * direction
        minus = scalar(*args)
        np.testing.assert_allclose(
            jnp.vdot(grads[i], direction), (plus - minus) / (2 * eps), rtol=1e-6
        )


@pytest.mark.parametrize("kind", ORDERS)
def test_readout_reads_zero_on_masked_slots_and_adds_into_a_column(kind, blocks):
    layout, order = Layout(SHAPE), ORDERS[kind]
    rng = np.random.default_rng(7)
    pos = jnp.asarray(rng.uniform(0, 1, (300, 3)) * BOX, jnp.float32)
    mask = jnp.asarray(rng.uniform(size=300) > 0.5)
    field = jnp.asarray(rng.normal(size=(*SHAPE, 3)), jnp.float32)
    plain = readout(field, pos, layout, CELL, order)
    masked = readout(field, pos, layout, CELL, order, mask=mask)
    np.testing.assert_array_equal(masked, jnp.where(mask[:, None], plain, 0))
    base = jnp.asarray(rng.normal(size=(300, 3)), jnp.float32)
    kicked = readout(field[..., 1], pos, layout, CELL, order, mask=mask, add_to=(base, 1, 0.5))
    expected = base.at[:, 1].add(0.5 * masked[:, 1])
    np.testing.assert_allclose(kicked, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(kicked[:, [0, 2]], base[:, [0, 2]])
    with pytest.raises(ValueError, match="add_to needs a scalar field"):
        readout(field, pos, layout, CELL, order, add_to=(base, 1, 0.5))


@pytest.mark.parametrize("kind", ORDERS)
def test_readout_added_into_a_column_has_the_gradients_of_finite_differences(x64, kind, blocks):
    """The hand-written VJP of ``readout(..., add_to=(base, column, scale))`` (a kick by one
    force component): gradients w.r.t. the field, positions, base and scale, with masked
    slots and a traced column (as in the force's loop over components)."""
    layout, order = Layout(SHAPE), ORDERS[kind]
    rng = np.random.default_rng(8)
    pos = jnp.asarray(rng.uniform(0.1, 0.9, (43, 3)) * BOX)
    mask = jnp.asarray(rng.uniform(size=43) > 1 / 3)
    field = jnp.asarray(rng.normal(size=SHAPE))
    base = jnp.asarray(rng.normal(size=(43, 3)))
    probe = jnp.asarray(rng.normal(size=(43, 3)))

    def scalar(field, pos, base, scale):
        out = jax.lax.fori_loop(
            1, 2, lambda c, b: readout(field, pos, layout, CELL, order, mask, (b, c, scale)), base
        )
        return jnp.sum(probe * out**2)

    args = [field, pos, base, jnp.asarray(0.7)]
    grads = jax.grad(scalar, argnums=(0, 1, 2, 3))(*args)
    assert not np.any(np.asarray(grads[1])[~np.asarray(mask)])
    eps = 1e-6
    for i, x in enumerate(args):
        direction = jnp.asarray(rng.normal(size=x.shape))
        shifted = [list(args), list(args)]
        shifted[0][i], shifted[1][i] = x + eps * direction, x - eps * direction
        numeric = (scalar(*shifted[0]) - scalar(*shifted[1])) / (2 * eps)
        np.testing.assert_allclose(jnp.vdot(grads[i], direction), numeric, rtol=1e-6)


@pytest.mark.parametrize("kind", ORDERS)
def test_one_mass_for_all_paints_and_differentiates_as_per_particle_masses(x64, kind, blocks):
    """A scalar mass is not spread over the slots: same mesh as the per-particle array, and
    its gradient (the sum of the per-particle ones) matches finite differences."""
    layout, order = Layout(SHAPE), ORDERS[kind]
    rng = np.random.default_rng(9)
    pos = jnp.asarray(rng.uniform(0.1, 0.9, (43, 3)) * BOX)
    mask = jnp.asarray(rng.uniform(size=43) > 1 / 3)
    probe = jnp.asarray(rng.normal(size=SHAPE))

    def scalar(mass, pos):
        return jnp.vdot(paint(pos, mass, layout, CELL, order, mask=mask) ** 2, probe)

    one, each = jnp.asarray(1.3), jnp.full(43, 1.3)
    np.testing.assert_allclose(
        paint(pos, one, layout, CELL, order, mask=mask),
        paint(pos, each, layout, CELL, order, mask=mask),
        rtol=1e-12,
    )
    g_one, g_pos_one = jax.grad(scalar, argnums=(0, 1))(one, pos)
    g_each, g_pos_each = jax.grad(scalar, argnums=(0, 1))(each, pos)
    np.testing.assert_allclose(g_one, jnp.sum(g_each), rtol=1e-12)
    np.testing.assert_allclose(g_pos_one, g_pos_each, rtol=1e-12, atol=1e-12)
    eps = 1e-6
    numeric = (scalar(one + eps, pos) - scalar(one - eps, pos)) / (2 * eps)
    np.testing.assert_allclose(g_one, numeric, rtol=1e-6)


@pytest.mark.parametrize("kind", ORDERS)
def test_positions_at_the_box_edge_or_outside_keep_their_mass(kind):
    """A float32 position that rounds to L, or one outside the box, paints its periodic image."""
    box, n = (100.0,) * 3, (6, 6, 6)  # 100/(100/6) rounds to exactly 6 cells in float32
    cell = tuple(b / m for b, m in zip(box, n, strict=True))
    edge = np.nextafter(np.float32(100.0), np.float32(0.0))
    pos = jnp.asarray([[edge, 50.0, 50.0], [50.0, edge, edge], [120.0, -30.0, 50.0]], jnp.float32)
    mesh = paint(pos, 1.0, Layout(n), cell, ORDERS[kind])
    np.testing.assert_allclose(float(mesh.sum()), 3.0, rtol=1e-6)
    image = jnp.asarray([[20.0, 70.0, 50.0]], jnp.float32)
    np.testing.assert_allclose(
        paint(pos[2:], 1.0, Layout(n), cell, ORDERS[kind]),
        paint(image, 1.0, Layout(n), cell, ORDERS[kind]),
        atol=1e-5,
    )
