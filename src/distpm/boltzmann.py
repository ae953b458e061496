"""Linear spectra from CAMB, the Boltzmann code, for ``linear_power = "camb"``.

The cosmology maps to CAMB's parameters as H0 = 100 h, ombh2 = Omega_b h^2,
omch2 = Omega_c h^2, TCMB = T_cmb, ns = n_s, flat, w0 and wa through CAMB's
PPF dark energy, and massless neutrinos only (mnu = 0; CAMB's N_eff counts
as radiation there, which distpm's background neglects). Only the shape of
P(k) at z = 0 is used, on K_POINTS log-spaced k from K_MIN to K_MAX [h/Mpc]:
it is renormalised to sigma8 like a table (:mod:`distpm.linear_power`), so
gradients with respect to the cosmology flow through sigma8 and the growth
factor only. CAMB runs outside JAX's tracing (``jax.pure_callback``), once
per set of parameters in a process.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

K_MIN, K_MAX, K_POINTS = 1e-4, 50.0, 2001  # [h/Mpc]; log-log steps of 0.0065
PARAMETERS = ("Omega_c", "Omega_b", "h", "n_s", "T_cmb", "w0", "wa")


@functools.lru_cache(maxsize=32)
def camb_table(omega_c, omega_b, h, n_s, t_cmb, w0, wa) -> tuple[np.ndarray, np.ndarray]:
    """(k [h/Mpc], P [(Mpc/h)^3]) of CAMB's linear matter spectrum at z = 0 (float64; its
    amplitude is CAMB's for A_s = 2e-9, which distpm replaces by sigma8)."""
    try:
        import camb
    except ImportError:
        raise ImportError(
            'linear_power = "camb" needs the camb package: pip install camb'
        ) from None
    pars = camb.CAMBparams()
    pars.set_cosmology(
        H0=100 * h, ombh2=omega_b * h * h, omch2=omega_c * h * h, mnu=0.0,
        num_massive_neutrinos=0, TCMB=t_cmb, omk=0.0,
    )  # fmt: skip
    if (w0, wa) != (-1.0, 0.0):
        pars.set_dark_energy(w=w0, wa=wa, dark_energy_model="ppf")
    pars.InitPower.set_params(ns=n_s, As=2e-9)
    pars.set_matter_power(redshifts=[0.0], kmax=1.2 * K_MAX * h)
    results = camb.get_results(pars)
    k, _, p = results.get_matter_power_spectrum(minkh=K_MIN, maxkh=K_MAX, npoints=K_POINTS)
    return np.asarray(k), np.asarray(p[0])


def table(cosmo, dtype):
    """CAMB's (k, P) for ``cosmo`` as two arrays of ``dtype``, also under ``jax.jit``
    (without gradient: the parameters are read as values)."""
    values = jnp.stack([jnp.asarray(getattr(cosmo, name), dtype) for name in PARAMETERS])

    def run(values):
        k, p = camb_table(*(float(v) for v in np.asarray(values, np.float64)))
        return np.stack([k, p]).astype(dtype)

    shape = jax.ShapeDtypeStruct((2, K_POINTS), dtype)
    out = jax.pure_callback(run, shape, jax.lax.stop_gradient(values), vmap_method="sequential")
    return out[0], out[1]


def version() -> str | None:
    """The installed camb's version, or None."""
    try:
        import camb
    except ImportError:
        return None
    return camb.__version__
