"""PPO on Brax inverted_pendulum on CPU, 3 seeds: learning curves, steps/s and compile time, and
the Brax environment's own step rate and compile time next to gymnax's.

    pip install -e '.[brax]'
    python experiments/ppo_brax.py                 # 3 seeds x 500k env steps (~2 min, 2 cores)
    python experiments/ppo_brax.py --quick         # smoke run, writes to a temp dir
    python experiments/ppo_brax.py --replot experiments/results/ppo_brax.json

Target (issue 16): one Brax environment, with its learning curve and steps/s on CPU.

``brax/inverted_pendulum`` (Brax's default ``generalized`` pipeline): 4 observations, one action
in [-1, 1], reward 1 per step, terminated when the pole leans past 0.2 rad, truncated after 1000
steps (rljax's adapter maps Brax's ``info["truncation"]`` onto ``truncated``, which bootstraps
from the final observation). Config: the Pendulum-v1 study's (``ppo_continuous.py``: 16 envs x
64 steps, 4 epochs x 4 minibatches, lr 1e-3 annealed, no value clipping, entropy 0, 2x64 tanh)
with gamma 0.99 for the 1000-step horizon; unchanged otherwise, untuned. The seeds are vmapped
in one jit on a ``data=1,model=1`` mesh; seed ``s`` starts from ``jax.random.key(s)``.

Environment-only table: ``reset`` and ``STEPS`` random-action ``step`` calls of ``B`` batched
environments in one ``lax.scan`` (auto-reset included), compile time of that program and its
best-of-3 steps/s, for Brax inverted_pendulum and, for scale, gymnax Pendulum-v1 and CartPole-v1.

Writes ``experiments/results/ppo_brax.{md,json,png}`` (greedy evaluation: the Gaussian's mean,
20 episodes per seed).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import curve_study_main, log, write_json_compact  # noqa: E402
from rljax import PPOConfig  # noqa: E402

NAME = "ppo_brax"
ENV = "brax/inverted_pendulum"
STEPS = 200  # env steps per scan in the environment-only table
ENV_BATCHES = (16, 256)
ENV_ONLY = (ENV, "Pendulum-v1", "CartPole-v1")


def make_config(total_timesteps: int) -> PPOConfig:
    return PPOConfig(
        env=ENV,
        num_envs=16,
        num_steps=64,
        total_timesteps=total_timesteps,
        update_epochs=4,
        num_minibatches=4,
        lr=1e-3,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        clip_value_loss=False,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        actor_widths=(64, 64),
        critic_widths=(64, 64),
        activation="tanh",
    )


def summary(c: PPOConfig) -> str:
    return (
        f"PPO {c.env} (Brax, generalized pipeline), diagonal Gaussian (log-std init 0, actions "
        f"clipped at the env), {c.num_envs} envs x {c.num_steps} steps, {c.update_epochs} epochs "
        f"x {c.num_minibatches} minibatches, lr {c.lr:g} annealed, gamma {c.gamma:g}, ent "
        f"{c.ent_coef:g}, no value clipping, 2x64 {c.activation}"
    )


def env_only(name: str, num_envs: int) -> dict:
    """Compile seconds and best-of-3 steps/s of ``reset`` + ``STEPS`` random-action steps."""
    import jax
    import jax.numpy as jnp

    from rljax.envs import make_env

    env = make_env(name, num_envs)
    spec = env.spec

    def rollout(key):
        def step(batch, k):
            act_key, env_key = jax.random.split(k)
            if spec.continuous:
                low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
                shape = (num_envs, spec.action_dim)
                action = jax.random.uniform(act_key, shape, minval=low, maxval=high)
            else:
                action = jax.random.randint(act_key, (num_envs,), 0, spec.num_actions)
            batch, tr = env.step(env_key, batch, action)
            return batch, tr.final_obs.sum() + tr.reward.sum()  # keeps every step live

        batch, out = jax.lax.scan(step, env.reset(key), jax.random.split(key, STEPS))
        return out.sum() + batch.obs.sum()

    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(jax.random.key(0)).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(jax.random.key(i + 1)))
        times.append(time.perf_counter() - t0)
    return {
        "env": name,
        "num_envs": num_envs,
        "compile_s": round(compile_s, 2),
        "steps_per_s": round(num_envs * STEPS / min(times), 0),
    }


def env_only_markdown(rows: list[dict]) -> str:
    lines = [
        "",
        "## The environments alone",
        "",
        f"`reset` and {STEPS} random-action `step` calls of B batched environments in one "
        "`lax.scan` (auto-reset included), jitted: compile seconds of that program and its "
        "best-of-3 steps/s on the same machine (2 shared cores).",
        "",
        "| environment | B | compile s | env steps/s |",
        "|---|--:|--:|--:|",
    ]
    lines += [
        f"| {r['env']} | {r['num_envs']} | {r['compile_s']:.1f} | {r['steps_per_s']:,.0f} |"
        for r in rows
    ]
    rate = {(r["env"], r["num_envs"]): r["steps_per_s"] for r in rows}
    ratios = [
        f"{rate[('Pendulum-v1', b)] / rate[(ENV, b)]:.0f}x at B={b}"
        for b in ENV_BATCHES
        if (ENV, b) in rate and ("Pendulum-v1", b) in rate
    ]
    if ratios:
        lines += [
            "",
            f"gymnax Pendulum-v1 steps / Brax inverted_pendulum steps: {', '.join(ratios)}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    replot = "--replot" in argv
    if "--seeds" not in argv and not replot:
        argv += ["--seeds", "0", "1", "2"]
    report = curve_study_main(
        name=NAME,
        doc=__doc__,
        title=f"PPO {ENV} on CPU",
        make_config=make_config,
        config_summary=summary,
        default_timesteps=500_000,
        quick_timesteps=16 * 64 * 8,
        threshold=900.0,
        return_range=(0.0, 1000.0),
        argv=argv,
    )
    if replot:
        json_path = Path(argv[argv.index("--replot") + 1])
        rows = json.loads(json_path.read_text()).get("env_only", [])
    else:
        quick = "--quick" in argv
        rows = []
        for name in ENV_ONLY:
            for num_envs in ENV_BATCHES[:1] if quick else ENV_BATCHES:
                rows.append(env_only(name, num_envs))
                log(f"  env only: {rows[-1]}")
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        stem = Path(out) if out else None
        if stem is None:
            import tempfile

            results = Path(__file__).resolve().parent / "results"
            stem = (Path(tempfile.gettempdir()) / f"{NAME}_quick" if quick else results) / NAME
        json_path = stem.with_suffix(".json")
        report = json.loads(json_path.read_text())
        report["env_only"] = rows
        write_json_compact(json_path, NAME, report)
    md = json_path.with_suffix(".md")
    if rows:
        md.write_text(md.read_text() + env_only_markdown(rows))
        print(env_only_markdown(rows))
    return report


if __name__ == "__main__":
    main()
