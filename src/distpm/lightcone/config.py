"""Static lightcone configuration: observer, maps and sources (frozen, hashable, validated).

Units: observer position [Mpc/h] in box coordinates; field of view [deg];
redshifts dimensionless. The sky of the flat map is centred on the +z axis
seen from the observer; HEALPix maps use the RING scheme with theta measured
from +z and phi from +x towards +y.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np


@dataclasses.dataclass(frozen=True)
class SourceDistribution:
    """A source redshift distribution n(z) as a table (normalised when used).

    z: increasing redshifts (> 0); n: n(z) >= 0 at them (any normalisation),
    integrated with the trapezoid rule. :meth:`smail` tabulates the analytic
    n(z) ~ z^alpha exp(-(z/z0)^beta).
    """

    z: tuple[float, ...]
    n: tuple[float, ...]

    def __post_init__(self):
        z = tuple(float(v) for v in self.z)
        n = tuple(float(v) for v in self.n)
        object.__setattr__(self, "z", z)
        object.__setattr__(self, "n", n)
        if len(z) < 2 or len(z) != len(n):
            raise ValueError(
                f"n(z) needs >= 2 (z, n) pairs of equal length, got {len(z)}, {len(n)}"
            )
        if z[0] <= 0 or np.any(np.diff(z) <= 0):
            raise ValueError(f"n(z) redshifts must be positive and increasing, got z = {z[:4]}...")
        if min(n) < 0 or np.trapezoid(n, z) <= 0:
            raise ValueError("n(z) must be >= 0 with a positive integral")

    @classmethod
    def smail(cls, z0: float, alpha: float = 2.0, beta: float = 1.5, z_max: float = 3.0, num=256):
        """Smail et al. (1994) n(z) ~ z^alpha exp(-(z/z0)^beta), tabulated on (0, z_max]."""
        z = np.linspace(z_max / num, z_max, num)
        return cls(z=tuple(z), n=tuple(z**alpha * np.exp(-((z / z0) ** beta))))

    @property
    def z_max(self) -> float:
        return max(z for z, n in zip(self.z, self.n, strict=True) if n > 0)


@dataclasses.dataclass(frozen=True)
class LightconeConfig:
    """What the observer's past lightcone records during a run.

    observer: [Mpc/h] position in the box (default: the box centre).
    source_redshifts: discrete source planes z_s; one convergence map each.
    distributions: :class:`SourceDistribution` s; one map each, after the planes.
    nside: HEALPix resolution of the full-sky maps (None: no sphere).
    flat_fov: [deg] side of the square flat-sky field around +z (None: no flat map).
    flat_pixels: pixels per side of the flat map.

    The lightcone reaches back to the largest source redshift; the run must
    start before it (cfg.a_start <= 1 / (1 + z_max)) and end at a = 1.
    """

    observer: tuple[float, float, float] | None = None
    source_redshifts: tuple[float, ...] = (1.0,)
    distributions: tuple[SourceDistribution, ...] = ()
    nside: int | None = None
    flat_fov: float | None = None
    flat_pixels: int = 256

    def __post_init__(self):
        zs = tuple(float(z) for z in self.source_redshifts)
        object.__setattr__(self, "source_redshifts", zs)
        object.__setattr__(self, "distributions", tuple(self.distributions))
        if self.observer is not None:
            obs = tuple(float(v) for v in self.observer)
            if len(obs) != 3:
                raise ValueError(f"observer must be 3 coordinates [Mpc/h], got {self.observer!r}")
            object.__setattr__(self, "observer", obs)
        if any(not z > 0 for z in zs):
            raise ValueError(f"source_redshifts must be > 0, got {zs}")
        for d in self.distributions:
            if not isinstance(d, SourceDistribution):
                raise TypeError(f"distributions must hold SourceDistribution, got {type(d)}")
        if not zs and not self.distributions:
            raise ValueError("give source_redshifts or distributions: there is nothing to map")
        if self.nside is None and self.flat_fov is None:
            raise ValueError("choose a map: nside (HEALPix) and/or flat_fov [deg] (flat sky)")
        if self.nside is not None:
            n = self.nside
            if not isinstance(n, numbers.Integral) or n < 1 or n & (n - 1):
                raise ValueError(f"nside must be a power of 2, got {n!r}")
        if self.flat_fov is not None:
            if not 0 < float(self.flat_fov) < 90:
                raise ValueError(f"flat_fov must lie in (0, 90) degrees, got {self.flat_fov}")
            if not isinstance(self.flat_pixels, numbers.Integral) or self.flat_pixels < 2:
                raise ValueError(f"flat_pixels must be an integer >= 2, got {self.flat_pixels!r}")

    @classmethod
    def from_value(cls, value, base_dir=None) -> LightconeConfig | None:
        """From a ``[lightcone]`` table of a run file (None when absent or ``enabled = false``).

        Keys: the fields above, and these three:

        nz_smail: ``[z0, alpha, beta, z_max]``, or a list of them: Smail n(z) source
            distributions (tomographic bins), after the planes.
        nz_table: a file of two columns z, n(z), or a list of files (relative to
            ``base_dir``, the run file's directory): tabulated source distributions,
            after the Smail ones.
        enabled: ``false`` turns the lightcone off (default true when the table is given).
        """
        if value is None or value is False:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"lightcone must be a table of options, got {value!r}")
        value = dict(value)
        if not value.pop("enabled", True):
            return None
        dists = []
        smail = value.pop("nz_smail", [])
        if smail and not isinstance(smail[0], list | tuple):
            smail = [smail]  # one distribution
        for params in smail:
            if not isinstance(params, list | tuple) or len(params) != 4:
                raise ValueError(f"nz_smail must be [z0, alpha, beta, z_max], got {params!r}")
            z0, alpha, beta, z_max = (float(v) for v in params)
            dists.append(SourceDistribution.smail(z0, alpha, beta, z_max=z_max))
        tables = value.pop("nz_table", [])
        for table in [tables] if isinstance(tables, str) else tables:
            from pathlib import Path

            path = Path(table)
            if base_dir is not None and not path.is_absolute():
                path = Path(base_dir) / path
            if not path.is_file():
                raise ValueError(f"nz_table file {path} not found")
            z, n = np.loadtxt(path, unpack=True, ndmin=2)[:2]
            dists.append(SourceDistribution(z=tuple(z), n=tuple(n)))
        known = {f.name for f in dataclasses.fields(cls)} - {"distributions"}
        unknown = sorted(set(value) - known)
        if unknown:
            valid = sorted(known | {"enabled", "nz_smail", "nz_table"})
            raise ValueError(f"unknown lightcone option(s) {unknown}; valid: {valid}")
        if "source_redshifts" in value:
            value["source_redshifts"] = tuple(value["source_redshifts"])
        elif dists:
            value["source_redshifts"] = ()
        return cls(**value, distributions=tuple(dists))

    @property
    def n_sources(self) -> int:
        return len(self.source_redshifts) + len(self.distributions)

    @property
    def z_max(self) -> float:
        """Largest source redshift: where the lightcone starts."""
        return max([*self.source_redshifts, *(d.z_max for d in self.distributions)])

    def observer_position(self, cfg) -> np.ndarray:
        """[Mpc/h] the observer (the box centre unless given)."""
        if self.observer is None:
            return 0.5 * np.asarray(cfg.box_size)
        return np.asarray(self.observer, dtype=float)

    def check(self, cfg):
        """Raise ValueError if the run ``cfg`` cannot hold this lightcone."""
        a_far = 1.0 / (1.0 + self.z_max)
        if cfg.a_start > a_far * (1 + 1e-9):
            raise ValueError(
                f"the lightcone reaches z = {self.z_max} (a = {a_far:.4f}) but the run starts "
                f"at a_start = {cfg.a_start}: start the run earlier (a_start <= {a_far:.4f})"
            )
        if abs(cfg.a_stop - 1.0) > 1e-9:
            raise ValueError(f"a lightcone run must end at a_stop = 1 (today), got {cfg.a_stop}")
        obs = self.observer_position(cfg)
        if np.any(obs < 0) or np.any(obs > np.asarray(cfg.box_size)):
            raise ValueError(f"observer {tuple(obs)} lies outside the box {cfg.box_size} [Mpc/h]")
