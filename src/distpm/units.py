"""Physical constants and the unit conversions distpm's quantities need.

Inside distpm: lengths [Mpc/h], masses [1e10 Msun/h], momenta [100 km/s]
(see :mod:`distpm.state`). cgs constants: IAU 2015 nominal solar mass
(with CODATA 2018 G), IAU 2012 parsec.
"""

from __future__ import annotations

import math

MPC_CM = 3.0856775814913673e24  # [cm]
MSUN_G = 1.988409870698051e33  # [g]
G_CGS = 6.67430e-8  # [cm^3 g^-1 s^-2]
C_OVER_H0 = 2997.92458  # c / H0 [Mpc/h]
MASS_G = 1e10 * MSUN_G  # distpm's mass unit, 1e10 Msun (/h), in g (/h)


def critical_density() -> float:
    """[1e10 Msun/h per (Mpc/h)^3] 3 H0^2 / (8 pi G) today, from the constants above."""
    h0 = 1e7 / MPC_CM  # 100 km/s/Mpc in 1/s
    rho = 3.0 * h0**2 / (8.0 * math.pi * G_CGS)  # g/cm^3 (times h^2)
    return rho * MPC_CM**3 / MASS_G


def particle_mass(cosmo, cfg) -> float:
    """[1e10 Msun/h] mass of one particle: Omega_m rho_crit V / N."""
    volume = math.prod(cfg.box_size)
    return float(cosmo.Omega_m) * critical_density() * volume / cfg.n_particles
