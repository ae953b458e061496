"""Regenerate the reference tables in this folder from colossus and CAMB.

They are independent of distpm: the tests compare distpm's transfer
function, linear power and growth factor with them. Planck 2018 cosmology
(flat LCDM, h = 0.6766, Omega_m = 0.3111, Omega_b = 0.0490, n_s = 0.9665,
sigma8 = 0.8102, T_cmb = 2.7255 K). Run from anywhere:

    python tests/reference/make_tables.py [--check]

``--check`` writes nothing and says how far the tables here are from a fresh
computation (the largest relative difference per column).
"""

import argparse
import io
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
H, OMEGA_M, OMEGA_B, N_S, SIGMA8, T_CMB = 0.6766, 0.3111, 0.0490, 0.9665, 0.8102, 2.7255
PLANCK = f"h={H}, Omega_m={OMEGA_M}, Omega_b={OMEGA_B}, n_s={N_S}"


def _colossus():
    from colossus.cosmology import cosmology

    params = dict(flat=True, H0=100 * H, Om0=OMEGA_M, Ob0=OMEGA_B, sigma8=SIGMA8, ns=N_S)
    return cosmology.setCosmology("distpm-reference", **params, Tcmb0=T_CMB, relspecies=False)


def eh98():
    """Eisenstein & Hu (1998) with and without BAO wiggles, each normalised to sigma8."""
    from colossus.cosmology import power_spectrum

    cosmo = _colossus()
    k = np.logspace(-4, 1, 60)
    models = {  # with wiggles, without
        "eisenstein98": power_spectrum.modelEisenstein98,
        "eisenstein98_zb": power_spectrum.modelEisenstein98ZeroBaryon,
    }
    transfer = [model(k, H, OMEGA_M, OMEGA_B, T_CMB) for model in models.values()]
    power = [cosmo.matterPowerSpectrum(k, model=m) for m in models]
    header = (
        "Eisenstein & Hu 1998 linear matter power at z=0, computed with colossus 1.4.0 "
        "(independent reference).\n"
        f"cosmology: flat LCDM, {PLANCK}, sigma8={SIGMA8}, T_cmb={T_CMB} K, no radiation, "
        "no neutrinos\n"
        "sigma8 normalisation: top-hat R=8 Mpc/h over the Eisenstein-Hu (with BAO) spectrum "
        "for P_eh98, and over the no-wiggle spectrum for P_nowiggle\n"
        "columns: k [h/Mpc]  T_eh98  T_nowiggle  P_eh98 [(Mpc/h)^3]  P_nowiggle [(Mpc/h)^3]"
    )
    return header, np.column_stack([k, *transfer, *power])


def growth():
    """D1(a) / D1(a=1) by colossus's growth ODE (no radiation)."""
    cosmo = _colossus()
    a = np.array([0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.333333, 0.5, 0.666667, 0.8, 1.0])
    d = cosmo.growthFactor(1 / a - 1)
    header = (
        f"Linear growth factor D1(a)/D1(a=1) for the same cosmology (flat LCDM, "
        f"Omega_m={OMEGA_M}, no radiation), colossus 1.4.0 (ODE-based).\n"
        "columns: a  D1(a)/D1(1)"
    )
    return header, np.column_stack([a, d])


def camb_power():
    """CAMB's linear matter power at z = 0, rescaled to sigma8."""
    import camb

    pars = camb.CAMBparams()
    pars.set_cosmology(
        H0=100 * H, ombh2=OMEGA_B * H**2, omch2=(OMEGA_M - OMEGA_B) * H**2, mnu=0.0,
        nnu=3.046, TCMB=T_CMB,
    )  # fmt: skip
    pars.InitPower.set_params(ns=N_S, As=2.1e-9)
    pars.set_matter_power(redshifts=[0.0], kmax=20.0)
    results = camb.get_results(pars)
    k = np.logspace(-4, 1, 400)
    interp = results.get_matter_power_interpolator(nonlinear=False, hubble_units=True, k_hunit=True)
    p = interp.P(0.0, k)
    p *= (SIGMA8 / results.get_sigma8_0()) ** 2
    header = (
        f"CAMB {camb.__version__} linear matter power spectrum at z=0, rescaled to "
        f"sigma8={SIGMA8}.\n"
        f"cosmology: flat LCDM, h={H}, Omega_m={OMEGA_M} (cdm+baryons), Omega_b={OMEGA_B}, "
        f"n_s={N_S}, T_cmb={T_CMB} K, massless neutrinos (N_eff=3.046), radiation included "
        "by CAMB\n"
        "columns: k [h/Mpc]  P [(Mpc/h)^3]"
    )
    return header, np.column_stack([k, p])


TABLES = {
    "camb_planck18_z0.txt": camb_power,
    "eh98_planck18_z0.txt": eh98,
    "growth_planck18.txt": growth,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    for name, make in TABLES.items():
        header, table = make()
        path = HERE / name
        if args.check:
            old = np.loadtxt(path)
            diff = np.max(np.abs(table / old - 1), axis=0)
            print(f"{name}: largest relative difference per column {np.array2string(diff)}")
            continue
        text = io.StringIO()
        np.savetxt(text, table, fmt="%.8e", header=header)
        path.write_text(text.getvalue())
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
