"""The benchmark's "standard problem", run with JaxPM (the reference code).

Run it ONLY inside its own virtual environment, never in distpm's:

    python3 -m venv /work/bench-venv-jaxpm
    /work/bench-venv-jaxpm/bin/pip install "jaxpm==0.1.6" "jax==0.10.2" "diffrax==0.7.2" packaging
    /work/bench-venv-jaxpm/bin/python benchmarks/jaxpm_problem.py --n 64 --mode forward

(jaxdecomp, pulled in by jaxpm, imports ``packaging`` without declaring it;
jaxpm's ODE examples need ``diffrax``, which jaxpm does not declare either.)

Problem: periodic box of 256 Mpc/h, N^3 particles on an N^3 mesh, Planck18
(Omega_c=0.2621, Omega_b=0.0490, h=0.6766, n_s=0.9665, sigma8=0.8102; flat,
w0=-1, wa=0) through jax_cosmo, linear P(k) Eisenstein-Hu (jax_cosmo's
default), 2LPT initial conditions at a=0.1, evolved to a=1 in ``--steps`` fixed
steps linear in a, float32, one device. Everything is done with JaxPM's public
functions the way its own benchmark (benchmarks/bench_pm.py in the JaxPM repo)
and notebooks do it: ``linear_field`` -> ``lpt(order=2)`` (displacements,
"relative" painting) -> ``diffrax.diffeqsolve(ODETerm(make_diffrax_ode(...)),
LeapfrogMidpoint(), ConstantStepSize(), dt0=(1-0.1)/steps)`` -> ``cic_paint_dx``.
LeapfrogMidpoint does one force evaluation per step (the first step is an Euler
step); lpt(order=2) adds two FFT-only force computations.

The white noise is given (drawn once, outside the timed function, from
``--seed``); JaxPM's ``linear_field`` draws its own noise from a PRNG key, so we
hand it ours by swapping ``jaxpm.pm.normal_field`` while it is traced; the
rest of ``linear_field`` (P(k) scaling) is JaxPM's code, unchanged.

Protocol (``--mode``, one mode per process so each has its own peak memory):
  forward:  noise -> delta on the mesh (delta = CIC density - 1), jitted.
  gradient: jax.grad of sum(delta**2) w.r.t. the noise, jitted. diffrax's
            default adjoint, RecursiveCheckpointAdjoint, with diffrax's default
            max_steps=4096, as JaxPM's examples leave it (``--max-steps``
            changes it; the number of checkpoints diffrax keeps, and so the
            memory, grows like sqrt(max_steps)).
The cosmological parameters are traced arguments, so P(k) and the growth
tables are computed inside the timed function, as in JaxPM's examples.
First call (compilation + first run) is timed as compile_s; then ``--repeats``
calls, each ended with jax.block_until_ready; median_s is their median.
peak_rss_mib is the process's ru_maxrss at the end (peak_rss_compile_mib right
after the first call). One JSON line goes to stdout; anything else to stderr.
"""

import contextlib
import importlib.metadata as md
import json
import sys

from timing import problem_arguments, time_calls

PLANCK18 = dict(Omega_c=0.2621, Omega_b=0.0490, h=0.6766, n_s=0.9665, sigma8=0.8102)
BOX = 256.0
A_START, A_END = 0.1, 1.0


def build(n, steps, max_steps):
    """Return (forward, solver_name): forward(noise, params) -> (delta, num_steps)."""
    import diffrax
    import jax.numpy as jnp
    import jax_cosmo as jc
    import jaxpm.pm
    from jaxpm.painting import cic_paint_dx
    from jaxpm.pm import linear_field, lpt, make_diffrax_ode

    mesh_shape = [n] * 3
    k = jnp.logspace(-4, 1, 128)  # P(k) table, as in JaxPM's examples

    def cosmology(params):
        return jc.Cosmology(
            **{name: params[i] for i, name in enumerate(PLANCK18)}, Omega_k=0.0, w0=-1.0, wa=0.0
        )

    def forward(noise, params):
        # Two Cosmology objects, as in JaxPM's examples: jax_cosmo's P(k) fills
        # cosmo._workspace with a growth table that lacks the entries JaxPM's
        # 2LPT needs (KeyError 'h' in jaxpm.growth.dGfa otherwise).
        pk = jc.power.linear_matter_power(cosmology(params), k)
        cosmo = cosmology(params)
        pk_fn = lambda x: jnp.interp(x.reshape([-1]), k, pk).reshape(x.shape)  # noqa: E731

        # Feed the given white noise to JaxPM's linear_field (see docstring).
        draw = jaxpm.pm.normal_field
        jaxpm.pm.normal_field = lambda seed, shape, sharding=None: noise
        try:
            ic = linear_field(mesh_shape, [BOX] * 3, pk_fn, seed=None)
        finally:
            jaxpm.pm.normal_field = draw

        dx, p, _ = lpt(cosmo, ic, a=A_START, order=2)
        res = diffrax.diffeqsolve(
            diffrax.ODETerm(make_diffrax_ode(mesh_shape, paint_absolute_pos=False)),
            diffrax.LeapfrogMidpoint(),
            t0=A_START,
            t1=A_END,
            dt0=(A_END - A_START) / steps,
            y0=jnp.stack([dx, p], axis=0),
            args=cosmo,
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=max_steps,
        )
        rho = cic_paint_dx(res.ys[-1, 0])  # one particle per cell: mean density 1
        return rho - 1.0, res.stats["num_steps"]

    return forward, "diffrax.LeapfrogMidpoint+ConstantStepSize"


def main():
    ap = problem_arguments(__doc__.splitlines()[0])
    ap.add_argument(
        "--max-steps",
        type=int,
        default=4096,
        help="diffrax max_steps (4096 = diffrax's default, as in JaxPM's examples)",
    )
    args = ap.parse_args()

    if sys.prefix == sys.base_prefix:
        sys.exit(
            "jaxpm_problem.py: run me with the python of the JaxPM venv "
            "(e.g. /work/bench-venv-jaxpm/bin/python), not the system one"
        )

    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the JSON line
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", False)  # float32 throughout
        forward, solver = build(args.n, args.steps, args.max_steps)
        noise = jax.random.normal(jax.random.PRNGKey(args.seed), (args.n,) * 3, jnp.float32)
        params = jnp.array(list(PLANCK18.values()), jnp.float32)

        if args.mode == "forward":
            fn = jax.jit(forward)
        else:

            def loss(noise, params):
                delta, num_steps = forward(noise, params)
                return jnp.sum(delta**2), num_steps

            fn = jax.jit(jax.grad(loss, has_aux=True))
        noise, params = jax.block_until_ready((noise, params))

        (out, num_steps), timings = time_calls(fn, noise, params, repeats=args.repeats)
        if not bool(jnp.all(jnp.isfinite(out))):
            sys.exit("jaxpm_problem.py: non-finite output")

    print(
        json.dumps(
            {
                "code": "jaxpm",
                "version": md.version("jaxpm"),
                "jax_version": jax.__version__,
                "diffrax_version": md.version("diffrax"),
                "jaxdecomp_version": md.version("jaxdecomp"),
                "jax_cosmo_version": md.version("jax_cosmo"),
                "mesh": args.n,
                "steps": args.steps,
                "num_steps_taken": int(num_steps),
                "mode": args.mode,
                "solver": solver,
                "adjoint": "diffrax.RecursiveCheckpointAdjoint (default)"
                if args.mode == "gradient"
                else None,
                "max_steps": args.max_steps,
                "device": str(jax.devices()[0]),
                **timings,
            }
        )
    )


if __name__ == "__main__":
    main()
