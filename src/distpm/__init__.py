"""distpm: distributed, differentiable cosmological particle-mesh simulations on JAX.

Units: lengths [Mpc/h], wavenumbers [h/Mpc], P(k) [(Mpc/h)^3], time variable
the scale factor a, canonical momenta [100 km/s] (see :mod:`distpm.state`).
"""

from distpm.parallel import devices as _devices

if _devices.deterministic_asked():  # before JAX makes its backends: XLA reads its flags then
    _devices.set_deterministic()
if _devices.cpu_schedule_chosen() is None:  # likewise XLA's CPU schedule (docs/guides/memory.md)
    _devices.prefer_low_memory_cpu_schedule()

from distpm import io  # noqa: E402
from distpm.analysis.catalogue import HaloCatalogue, halo_catalogue
from distpm.analysis.fof import fof, fof_points
from distpm.analysis.morton import morton_keys, morton_sort
from distpm.analysis.neighbours import knn, knn_points
from distpm.analysis.overdensity import spherical_overdensity
from distpm.analysis.power import power_spectrum
from distpm.background import growth_factor, growth_rate
from distpm.config import SimConfig
from distpm.cosmology import Cosmology
from distpm.ic import white_noise
from distpm.linear_power import linear_power
from distpm.parallel.overflow import CapacityError
from distpm.simulation import (
    density,
    evolve,
    initial_conditions,
    simulate,
    simulate_snapshots,
)
from distpm.state import Particles, linear_ids
from distpm.version import __version__  # noqa: F401 (the package's version)

__all__ = [
    "CapacityError",
    "Cosmology",
    "HaloCatalogue",
    "Particles",
    "SimConfig",
    "density",
    "evolve",
    "fof",
    "fof_points",
    "growth_factor",
    "growth_rate",
    "halo_catalogue",
    "initial_conditions",
    "io",
    "knn",
    "knn_points",
    "linear_ids",
    "linear_power",
    "morton_keys",
    "morton_sort",
    "power_spectrum",
    "simulate",
    "simulate_snapshots",
    "spherical_overdensity",
    "white_noise",
]
