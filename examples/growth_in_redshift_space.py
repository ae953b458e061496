"""P(k) measured inside the steps (an observer), then the redshift-space multipoles of the
final particles against Kaiser's linear prediction.

The run carries a :class:`distpm.analysis.power_steps.PowerSteps` observer:
the one step loop hands it the particles of every step, and it keeps P(k)
every few steps without stopping the compiled run. The script prints how
the largest scales grew against linear theory's D(a)^2, moves the final
particles to redshift space along z, and compares P0 and P2 with Kaiser's
(1 + 2f/3 + f^2/5) P_lin and (4f/3 + 4f^2/7) P_lin. It writes
``growth_in_redshift_space.png``.

    python examples/growth_in_redshift_space.py            # 64^3 in 512 Mpc/h: about a minute
    python examples/growth_in_redshift_space.py --smoke    # 16^3: seconds
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import distpm  # noqa: E402
from distpm.analysis.power import multipoles  # noqa: E402
from distpm.analysis.power_steps import PowerSteps  # noqa: E402
from distpm.analysis.redshift import kaiser, redshift_space  # noqa: E402

COSMO = distpm.Cosmology.planck18()


def main(cfg, every, out):
    observer = PowerSteps(cfg, every)
    state = distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg)
    (final,), (rows,) = distpm.evolve(state, COSMO, cfg, observers=(observer,))
    k, a, p = observer.table(rows)
    growth = np.asarray(distpm.growth_factor(np.float32(a), COSMO)) ** 2
    print("a      P(k_min, a) / P(k_min, a_end)   (D / D_end)^2")
    for a_i, ratio, lin in zip(a, p[:, 0] / p[-1, 0], growth / growth[-1], strict=True):
        print(f"{a_i:.3f}  {ratio:.4f}                         {lin:.4f}")

    moved = distpm.density(redshift_space(final, COSMO, cfg, axis=2), cfg)
    k_s, poles, n_modes = (np.asarray(x) for x in multipoles(moved, cfg, axis=2))
    filled = n_modes > 0
    k_s, poles = k_s[filled], poles[:, filled]
    f = float(distpm.growth_rate(1.0, COSMO))
    p_lin = np.asarray(distpm.linear_power(k_s, COSMO, 1.0))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.loglog(k, p.T, lw=1)
    left.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    left.set_ylabel(r"$P(k)$ inside the run")
    for ell, row in zip((0, 2), poles[:2], strict=True):
        line = right.semilogx(k_s, k_s * row, "o-", ms=3, label=f"$P_{ell}$")[0]
        right.semilogx(k_s, k_s * kaiser(p_lin, f, ell), "--", color=line.get_color())
    right.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    right.set_ylabel(r"$k P_\ell$ (dashed: Kaiser)")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "growth_in_redshift_space.png", dpi=110)
    ratio = poles[0, :3] / kaiser(p_lin[:3], f, 0)
    print(f"P0 / Kaiser at the three lowest k: {np.round(ratio, 3)}")
    print(f"wrote {out / 'growth_in_redshift_space.png'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="16^3 particles: seconds")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the plot")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        main(distpm.SimConfig(box_size=256.0, mesh_shape=16, n_steps=4), 2, args.out)
    else:
        main(distpm.SimConfig(box_size=512.0, mesh_shape=64, n_steps=20), 4, args.out)
