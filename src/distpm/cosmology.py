"""Cosmological parameters as a differentiable pytree.

All fields are JAX-traceable scalars, so ``jax.grad`` can differentiate any
quantity with respect to them. Flat universes only: Omega_de = 1 - Omega_m.
Radiation and massive neutrinos are neglected.
"""

from __future__ import annotations

import dataclasses
import math

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cosmology:
    """Flat w0waCDM cosmology.

    Omega_c: cold dark matter density parameter today.
    Omega_b: baryon density parameter today.
    h: H0 / (100 km/s/Mpc).
    n_s: primordial spectral index.
    sigma8: rms linear density contrast in top-hat spheres of 8 Mpc/h at a=1.
    w0, wa: dark-energy equation of state w(a) = w0 + wa (1 - a).
    T_cmb: CMB temperature today [K] (enters the Eisenstein-Hu transfer function).
    """

    Omega_c: float
    Omega_b: float
    h: float
    n_s: float
    sigma8: float
    w0: float = -1.0
    wa: float = 0.0
    T_cmb: float = 2.7255

    @property
    def Omega_m(self):
        """Total matter density parameter today (CDM + baryons)."""
        return self.Omega_c + self.Omega_b

    @property
    def Omega_de(self):
        """Dark-energy density parameter today (flatness)."""
        return 1.0 - self.Omega_m

    @classmethod
    def planck18(cls) -> Cosmology:
        """Planck 2018 (TT,TE,EE+lowE+lensing+BAO), Table 2 last column."""
        return cls(Omega_c=0.3111 - 0.0490, Omega_b=0.0490, h=0.6766, n_s=0.9665, sigma8=0.8102)

    @classmethod
    def planck15(cls) -> Cosmology:
        """Planck 2015 (TT,TE,EE+lowP+lensing+ext), Table 4 last column."""
        return cls(Omega_c=0.3089 - 0.0486, Omega_b=0.0486, h=0.6774, n_s=0.9667, sigma8=0.8159)

    def check(self) -> Cosmology:
        """Raise ValueError if the parameters are unphysical; return the cosmology.

        Needs Omega_c, Omega_b >= 0, 0 < Omega_m <= 1, h, sigma8, T_cmb > 0
        and finite values. Traced values (inside ``jax.jit``, ``jax.grad``,
        ``jax.vmap``) cannot be read and are not checked.
        """
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        if any(isinstance(v, jax.core.Tracer) for v in values):
            return self
        with jax.ensure_compile_time_eval():  # concrete values, also when closed over in a jit
            return self._check(values)

    def _check(self, values) -> Cosmology:
        checks = {
            "Omega_c >= 0": self.Omega_c >= 0,
            "Omega_b >= 0": self.Omega_b >= 0,
            "0 < Omega_m <= 1": 0 < self.Omega_m <= 1,
            "h > 0": self.h > 0,
            "sigma8 > 0": self.sigma8 > 0,
            "T_cmb > 0": self.T_cmb > 0,
        }
        failed = [name for name, ok in checks.items() if not bool(ok)]
        if failed or not all(math.isfinite(float(v)) for v in values):
            need = ", ".join(failed) or "finite values"
            shown = ", ".join(
                f"{f.name}={float(v):.6g}"
                for f, v in zip(dataclasses.fields(self), values, strict=True)
            )
            raise ValueError(f"unphysical cosmology (need {need}): {shown}")
        return self

    def replace(self, **changes) -> Cosmology:
        """A copy with some parameters changed (``cosmo.replace(sigma8=0.9)``)."""
        return dataclasses.replace(self, **changes)
