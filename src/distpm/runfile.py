"""The run file of ``distpm run``: TOML tables, ``--set`` overrides, and the settings they
make (:class:`~distpm.config.SimConfig`, the cosmology, ``[output]``, ``[halos]``,
``[lightcone]``)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import tomllib
from pathlib import Path
from typing import Any

from distpm.analysis.fof import FoFOptions
from distpm.config import SimConfig
from distpm.cosmology import Cosmology
from distpm.lightcone.config import LightconeConfig
from distpm.linear_power import resolved
from distpm.parallel.decomposition import ParallelOptions


def settings(values: dict[str, Any], base: Path | None = None) -> tuple:
    """(SimConfig, Cosmology, OutputConfig, HalosConfig, LightconeConfig or None) from a run
    file's tables (``[parallel]`` makes the config's parallel options); relative file names
    (a linear_power table, n(z) files) are read from ``base``, the run file's directory,
    where they exist there."""
    values = dict(values)
    power = values.get("linear_power")
    if base is not None and isinstance(power, str) and not Path(power).is_absolute():
        if (base / power).is_file():
            values["linear_power"] = str(base / power)
    cosmo = cosmology_from_dict(values.pop("cosmology", {}))
    output = OutputConfig.from_dict(values.pop("output", {}))
    halos = HalosConfig.from_value(values.pop("halos", False))
    lightcone = LightconeConfig.from_value(values.pop("lightcone", None), base)
    for table, cls in (("output", OutputConfig), ("parallel", ParallelOptions)):
        misplaced = sorted(set(values) & {f.name for f in dataclasses.fields(cls)})
        if misplaced:
            raise ValueError(
                f"{misplaced} belong in the [{table}] table ({table}.{misplaced[0]}=...)"
            )
    cfg = SimConfig.from_dict(values)
    resolved(cfg.linear_power)  # a table that is not there fails here, before any work
    return cfg, cosmo, output, halos, lightcone


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML run file; raise ValueError with the file name on failure."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {err}") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``key=value`` (``section.key=value`` for tables) with a TOML value.

    Values are TOML literals (``n_steps=20``, ``mesh_shape=[32,32,64]``,
    ``paint="tsc"``); a bare word that is not valid TOML is taken as a string
    (``paint=tsc``).
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects key=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of nested ``values`` with ``--set`` overrides applied."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for text in overrides:
        keys, value = parse_override(text)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {text!r}: {k!r} is not a table")
        node[keys[-1]] = value
    return out


SNAPSHOT_FORMATS = ("gadget4", "none")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """What ``distpm run`` writes besides spectra and plots (the ``[output]`` table of a run file).

    snapshot_format: "gadget4" (default): a Gadget-4 HDF5 snapshot at each of
        ``snapshots`` and at a_stop (``snapdir_XXX/snapshot_XXX.{rank}.hdf5``,
        see :mod:`distpm.io.gadget`); "none": no particle files.
    snapshot_double: write snapshot coordinates and velocities in float64
        (default false: float32, as Gadget-4 does).
    checkpoint_every: write a checkpoint every this many steps (0: never).
    checkpoint_minutes: also write one when this much wall time has passed
        since the last (0: never). ``distpm run --resume OUT`` continues
        from the newest (see :mod:`distpm.io.checkpoint`).
    keep_checkpoints: how many of the newest checkpoints stay on disk (at
        least 1; default 2, so that a damaged one leaves one to fall back on).
    power_every: also measure P(k) every this many steps, inside the steps
        (0: never): ``power_steps.txt`` and ``power_steps.png``
        (:class:`distpm.analysis.power_steps.PowerSteps`).
    multipoles: also write the redshift-space multipoles P0, P2, P4 at every
        output (``multipoles.txt``, ``multipoles.png``).
    line_of_sight: the axis the multipoles' redshift space moves along: "x",
        "y" or "z" (plane-parallel).
    """

    snapshot_format: str = "gadget4"
    snapshot_double: bool = False
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0.0
    keep_checkpoints: int = 2
    power_every: int = 0
    multipoles: bool = False
    line_of_sight: str = "z"

    def __post_init__(self):
        if self.snapshot_format not in SNAPSHOT_FORMATS:
            raise ValueError(
                f"output.snapshot_format must be one of {SNAPSHOT_FORMATS}, "
                f"got {self.snapshot_format!r}"
            )
        if not isinstance(self.snapshot_double, bool):
            raise TypeError(
                f"output.snapshot_double must be true or false, got {self.snapshot_double!r}"
            )
        for name in ("checkpoint_every", "power_every"):
            every = getattr(self, name)
            if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 0:
                raise ValueError(f"output.{name} must be an integer >= 0, got {every!r}")
        keep = self.keep_checkpoints
        if isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or keep < 1:
            raise ValueError(f"output.keep_checkpoints must be an integer >= 1, got {keep!r}")
        if not isinstance(self.multipoles, bool):
            raise TypeError(f"output.multipoles must be true or false, got {self.multipoles!r}")
        if self.line_of_sight not in ("x", "y", "z"):
            raise ValueError(
                f'output.line_of_sight must be "x", "y" or "z", got {self.line_of_sight!r}'
            )
        minutes = self.checkpoint_minutes
        if (
            isinstance(minutes, bool)
            or not isinstance(minutes, numbers.Real)
            or not (0 <= minutes < math.inf)
        ):
            raise ValueError(f"output.checkpoint_minutes must be a number >= 0, got {minutes!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> OutputConfig:
        if not isinstance(values, dict):
            raise ValueError(f"output must be a table of options, got {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown output option(s) {unknown}; valid: {sorted(known)} (in [output])"
            )
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class HalosConfig:
    """Friends-of-friends halos of the final snapshot (``halos = true`` or a ``[halos]`` table).

    enabled: find halos (a ``[halos]`` table turns it on unless it says
        ``enabled = false``).
    linking_length: b, in units of the mean inter-particle separation.
    min_members: the smallest halo kept (particles).
    ghost_factor: FoF's buffer (see :func:`distpm.fof`).
    group_factor: the catalogue's buffer (see :func:`distpm.halo_catalogue`).
    """

    enabled: bool = False
    linking_length: float = 0.2
    min_members: int = 20
    ghost_factor: float = 4.0
    group_factor: float = 0.05

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise TypeError(f"halos.enabled must be true or false, got {self.enabled!r}")
        self.fof_options()  # checks them
        if not 0 < self.group_factor < math.inf:
            raise ValueError(f"halos.group_factor must be > 0, got {self.group_factor!r}")

    def fof_options(self) -> FoFOptions:
        """FoF's options (what :func:`distpm.fof` takes as keywords)."""
        return FoFOptions(self.linking_length, self.min_members, self.ghost_factor)

    @classmethod
    def from_value(cls, value) -> HalosConfig:
        """From ``halos = true/false`` or a ``[halos]`` table of options."""
        if isinstance(value, bool):
            return cls(enabled=value)
        if not isinstance(value, dict):
            raise ValueError(f"halos must be true, false or a table of options, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown halos option(s) {unknown}; valid: {sorted(known)}")
        return cls(**{"enabled": True, **value})


COSMOLOGY_PRESETS = {"planck18": Cosmology.planck18, "planck15": Cosmology.planck15}


def cosmology_from_dict(values: dict) -> Cosmology:
    """Cosmology from a ``[cosmology]`` table: an optional ``preset`` plus overrides.

    ``Omega_m`` may be given instead of ``Omega_c`` (then Omega_c = Omega_m - Omega_b).
    """
    if not isinstance(values, dict):
        raise ValueError(f"cosmology must be a table of parameters, got {values!r}")
    values = dict(values)
    preset = values.pop("preset", "planck18")
    if preset not in COSMOLOGY_PRESETS:
        raise ValueError(
            f"unknown cosmology preset {preset!r}; use one of {sorted(COSMOLOGY_PRESETS)}"
        )
    known = {f.name for f in dataclasses.fields(Cosmology)}
    unknown = sorted(set(values) - known - {"Omega_m"})
    if unknown:
        raise ValueError(
            f"unknown cosmology parameter(s) {unknown}; "
            f"valid: {sorted(known | {'Omega_m', 'preset'})}"
        )
    text = {k: v for k, v in values.items() if isinstance(v, str | bool)}
    try:
        if text:  # quoted numbers are refused, as everywhere in a run file
            raise TypeError
        values = {k: float(v) for k, v in values.items()}
    except (TypeError, ValueError):
        raise ValueError(f"cosmology parameters must be numbers, got {text or values}") from None
    base = COSMOLOGY_PRESETS[preset]()
    if "Omega_m" in values:
        if "Omega_c" in values:
            raise ValueError("give Omega_m or Omega_c, not both")
        values["Omega_c"] = values.pop("Omega_m") - values.get("Omega_b", base.Omega_b)
    return base.replace(**values).check()
