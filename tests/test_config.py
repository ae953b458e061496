"""Configuration: validation errors name the problem and the values."""

import jax.numpy as jnp
import pytest

import distpm
from distpm.config import SimConfig
from distpm.linear_power import resolved
from distpm.parallel.decomposition import Decomposition, ParallelOptions
from distpm.runfile import apply_overrides, parse_override, read_toml, settings


def test_defaults_are_normalised():
    cfg = SimConfig(box_size=100, mesh_shape=16, particle_shape=8)
    assert cfg.box_size == (100.0, 100.0, 100.0)
    assert cfg.mesh_shape == (16, 16, 16)
    assert cfg.particle_shape == (8, 8, 8)
    assert cfg.cell_size == (6.25, 6.25, 6.25)
    assert hash(cfg) == hash(SimConfig(box_size=100, mesh_shape=16, particle_shape=8))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"box_size": -10.0}, "box_size must be positive"),
        ({"box_size": (10.0, 0.0, 10.0)}, "box_size must be positive"),
        ({"a_start": 1.0, "a_stop": 0.5}, "a_start < a_stop"),
        ({"a_start": 0.5, "a_stop": 0.5}, "a_start < a_stop"),
        ({"mesh_shape": 16, "particle_shape": 32}, "coarser than particle_shape"),
        ({"n_steps": 0}, "n_steps"),
        ({"lpt_order": 4}, "lpt_order"),
        ({"paint": "ngp"}, "paint must be one of"),
        ({"force_gradient": "spectral"}, "force_gradient must be one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"snapshots": (0.05,)}, "outside"),
        ({"mesh_shape": (16, 16)}, "3 numbers"),
    ],
)
def test_bad_values_raise_clear_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**changes)


def test_a_missing_power_table_is_refused_where_the_spectrum_is_read():
    # the config checks no files (it is the same object on any machine): the spectrum does,
    # and so does the run file, before any work
    cfg = SimConfig(linear_power="no_such_file.txt")
    with pytest.raises(ValueError, match="linear_power must be one of .* or an existing file"):
        resolved(cfg.linear_power)
    with pytest.raises(ValueError, match="linear_power must be one of .* or an existing file"):
        settings({"linear_power": "no_such_file.txt"})


def test_parallel_options_are_apart_from_the_physics():
    """[parallel] makes the config's parallel options; they are refused at the top level, and
    the config makes no device query: the grid and buffers are its decomposition's."""
    cfg, *_ = settings({"mesh_shape": 16, "parallel": {"devices": "2x1", "capacity_factor": 2}})
    assert cfg.parallel == ParallelOptions(devices=(2, 1), capacity_factor=2.0)
    assert cfg == SimConfig(mesh_shape=16, parallel={"devices": (2, 1), "capacity_factor": 2.0})
    dec = Decomposition.of(cfg)
    assert (dec.grid, dec.capacity, dec.exchange_size) == ((2, 1), 4096, 205)
    assert cfg.on("1x1").parallel == ParallelOptions(devices=(1, 1), capacity_factor=2.0)
    assert cfg.on(exchange_factor=0.5).parallel.devices == (2, 1)
    assert SimConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"\['devices'\] belong in the \[parallel\] table"):
        settings({"devices": "2x2"})
    with pytest.raises(ValueError, match=r"unknown parallel option\(s\) \['device'\]"):
        SimConfig(parallel={"device": "2x2"})


def test_non_integer_mesh_is_a_type_error():
    with pytest.raises(TypeError, match="whole numbers"):
        SimConfig(mesh_shape=16.5)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['n_step'\]; valid options"):
        SimConfig.from_dict({"n_step": 10})


def test_wrong_noise_shape_is_rejected():
    cfg = SimConfig(mesh_shape=8)
    with pytest.raises(
        ValueError, match=r"noise has shape \(4, 4, 4\), but particle_shape is \(8, 8, 8\)"
    ):
        distpm.simulate(jnp.zeros((4, 4, 4)), distpm.Cosmology.planck18(), cfg)


def test_wrong_position_shape_is_rejected():
    cfg = SimConfig(mesh_shape=8)
    for shape in ((10, 2), (10, 3)):
        with pytest.raises(
            ValueError, match=rf"pos has shape \({shape[0]}, {shape[1]}\), expected \(512, 3\)"
        ):
            distpm.density(jnp.zeros(shape), cfg)


def test_float64_without_x64_says_how_to_enable_it():
    cfg = SimConfig(mesh_shape=8, dtype="float64")
    with pytest.raises(ValueError, match="enable_x64"):
        distpm.white_noise(0, cfg)


def test_toml_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('mesh_shape = 16\npaint = "tsc"\n[cosmology]\nsigma8 = 0.8\n')
    values = apply_overrides(read_toml(path), ["n_steps=20", "cosmology.h=0.7", "paint=cic"])
    assert values == {
        "mesh_shape": 16,
        "paint": "cic",
        "n_steps": 20,
        "cosmology": {"sigma8": 0.8, "h": 0.7},
    }
    assert parse_override("mesh_shape=[8, 8, 16]") == (["mesh_shape"], [8, 8, 16])
    with pytest.raises(ValueError, match="key=value"):
        parse_override("n_steps")
    bad = tmp_path / "bad.toml"
    bad.write_text("mesh_shape = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_toml(bad)
    with pytest.raises(ValueError, match="does not exist"):
        read_toml(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compensate_force": "False"}, "compensate_force must be true, false or"),
        ({"fixed_amplitude": 1}, "fixed_amplitude must be true or false"),
        ({"n_steps": True}, "n_steps must be an integer"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"a_start": "0.1"}, "a_start must be a number"),
    ],
)
def test_wrong_types_are_rejected(changes, message):
    with pytest.raises(TypeError, match=message):
        SimConfig(**changes)


def test_snapshots_are_deduplicated_and_a_stop_is_the_final_state():
    cfg = SimConfig(snapshots=(0.5, 0.5, 1.0, 0.3))
    assert cfg.snapshots == (0.3, 0.5)
    with pytest.raises(ValueError, match="closer than 1e-4"):
        SimConfig(snapshots=(0.5, 0.50001))


def test_cosmology_table_is_validated():
    from distpm.runfile import cosmology_from_dict

    assert cosmology_from_dict({"Omega_m": 0.3, "Omega_b": 0.05}).Omega_c == pytest.approx(0.25)
    with pytest.raises(ValueError, match="not both"):
        cosmology_from_dict({"Omega_m": 0.3, "Omega_c": 0.1})
    with pytest.raises(ValueError, match="Omega_c >= 0"):
        cosmology_from_dict({"Omega_m": 0.03})
    with pytest.raises(ValueError, match="unknown cosmology preset"):
        cosmology_from_dict({"preset": "wmap"})
    with pytest.raises(ValueError, match="must be a table"):
        cosmology_from_dict(0.3)


def test_counts_past_int32_are_refused_only_where_they_cannot_work():
    # 2048^3 and 4096^3 particles: ids and slots are fine on enough devices
    assert Decomposition.of(SimConfig(mesh_shape=2048, parallel=(4, 2))).capacity == 3 * 2**29
    assert (
        SimConfig(
            mesh_shape=4096, parallel={"devices": (8, 8), "exchange_factor": 0.05}
        ).n_particles
        == 2**36
    )
    with pytest.raises(ValueError, match=r"on the grid 1x1; .* use more devices"):
        SimConfig(mesh_shape=2048, parallel=(1, 1))
    # 4096^3 on 64 devices at the default factors: 1.6e9 slots; on 16, 6.4e9 are refused
    assert Decomposition.of(SimConfig(mesh_shape=4096, parallel=(8, 8))).capacity == 1610612736
    with pytest.raises(ValueError, match="6442450944 particle slots"):
        SimConfig(mesh_shape=4096, parallel=(4, 4))
    with pytest.raises(ValueError, match="a plane of Ny x Nz = 2500000000 particles"):
        SimConfig(mesh_shape=(2, 50000, 50000))
    with pytest.raises(ValueError, match="capacity_factor must be >= 1"):
        SimConfig(mesh_shape=8, parallel={"capacity_factor": 0.9})
    with pytest.raises(ValueError, match="exchange_factor must be > 0"):
        SimConfig(mesh_shape=8, parallel={"exchange_factor": 0})


def test_messages_show_plain_numbers():
    """numpy scalars from a user's script are shown as numbers, not as np.float64(...)."""
    import numpy as np

    with pytest.raises(ValueError, match=r"n_steps must be a positive integer, got 0$"):
        distpm.SimConfig(n_steps=np.int64(0))
    with pytest.raises(ValueError, match=r"need sigma8 > 0\): Omega_c=0\.2621, .*sigma8=-1,"):
        distpm.Cosmology.planck18().replace(sigma8=np.float64(-1.0)).check()
