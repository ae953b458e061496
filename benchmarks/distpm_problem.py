"""The benchmark's "standard problem", run with distpm (one mode per process).

Problem and protocol are those of ``jaxpm_problem.py``: periodic box of
256 Mpc/h, N^3 particles on an N^3 mesh, Planck18, Eisenstein-Hu P(k), 2LPT at
a=0.1, ``--steps`` kick-drift-kick steps (linear in a) to a=1, float32, one
device. ``forward``: noise -> delta (CIC density - 1) on the mesh, jitted;
``gradient``: jax.grad of sum(delta**2) w.r.t. the noise, jitted. The
cosmological parameters are traced arguments, so P(k) and the growth tables
are computed inside the timed function. First call = compile_s; then
``--repeats`` calls with block_until_ready, median_s their median;
peak_rss_mib is the process's ru_maxrss. One JSON line on stdout.

    python benchmarks/distpm_problem.py --n 64 --mode gradient [--steps 10]
"""

import json
import sys

from timing import problem_arguments, time_calls

BOX = 256.0


def main():
    ap = problem_arguments(__doc__.splitlines()[0])
    ap.add_argument("--adjoint", choices=["reverse", "checkpoint"], default="reverse")
    ap.add_argument(
        "--compensate",
        type=int,
        choices=[0, 1],
        default=1,
        help="deconvolve the CIC window in the force (distpm's default: 1)",
    )
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import distpm

    cfg = distpm.SimConfig(
        box_size=BOX,
        mesh_shape=args.n,
        a_start=0.1,
        a_stop=1.0,
        n_steps=args.steps,
        lpt_order=2,
        adjoint=args.adjoint,
        compensate_force=bool(args.compensate),
    )
    cosmo = distpm.Cosmology.planck18()
    cosmo = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), cosmo)

    def forward(noise, cosmo):
        return distpm.density(distpm.simulate(noise, cosmo, cfg), cfg)

    if args.mode == "forward":
        fn = jax.jit(forward)
    else:
        fn = jax.jit(jax.grad(lambda noise, cosmo: jnp.sum(forward(noise, cosmo) ** 2)))
    noise = jax.block_until_ready(distpm.white_noise(args.seed, cfg))

    out, timings = time_calls(fn, noise, cosmo, repeats=args.repeats)
    if not bool(jnp.all(jnp.isfinite(out))):
        sys.exit("distpm_problem.py: non-finite output")
    print(
        json.dumps(
            {
                "code": "distpm",
                "version": distpm.__version__,
                "jax_version": jax.__version__,
                "mesh": args.n,
                "steps": args.steps,
                "mode": args.mode,
                "solver": "FastPM kick-drift-kick",
                "adjoint": args.adjoint if args.mode == "gradient" else None,
                "compensate_force": bool(args.compensate),
                "device": str(jax.devices()[0]),
                **timings,
            }
        )
    )


if __name__ == "__main__":
    main()
