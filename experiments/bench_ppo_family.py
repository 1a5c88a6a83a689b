"""PPO family throughput: rljax against PureJaxRL's continuous-action and recurrent PPO, side by
side in one run.

Pairs (the same hyperparameters on both sides; PureJaxRL on one device, rljax on each of
``--meshes``, default one device):
  continuous  Pendulum-v1 with PureJaxRL ``ppo_continuous_action.py``'s configuration (2048 envs x
              10 steps, 4 epochs x 32 minibatches, lr 3e-4 constant, 2x256 tanh towers,
              observation and reward normalisation); baseline
              ``experiments/baselines/purejaxrl_ppo_continuous.py``, rljax ``PPOConfig`` with
              ``normalize_obs`` and ``normalize_rewards``.
  recurrent   CartPole-v1 with PureJaxRL ``ppo_rnn.py``'s configuration (4 envs x 128 steps,
              4 minibatches of one whole sequence each, GRU 128 after a 128 relu embedding);
              baseline ``experiments/baselines/purejaxrl_ppo_rnn.py``, rljax's GRU PPO.

Columns: compile seconds (ahead-of-time ``lower().compile()``, never in steps/s); steps/s of the
compiled training call, best of ``--repeats`` (the repeats alternate between the two sides so
load drift hits both alike); the final training return (the last update's completed episodes,
mean over environments and seeds).

What differs by design, and costs rljax time: rljax bootstraps a truncated episode from
``V(final_observation)`` (PureJaxRL treats a time limit as a termination), and it merges the
observation and reward statistics once per rollout instead of once per step.

    python experiments/bench_ppo_family.py    # continuous at 1 seed, recurrent at 1 and 8 seeds
    python experiments/bench_ppo_family.py --meshes data=1,model=1 data=2   # + 2 devices
    python experiments/bench_ppo_family.py --pairs continuous --seeds 1 --repeats 1 --updates 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from experiments.bench_harness import log, machine_line, markdown_table, write_report  # noqa: E402

OUT = REPO_ROOT / "experiments" / "results" / "bench_ppo_family"
PAIRS = ("continuous", "recurrent")
DEFAULT_UPDATES = {"continuous": 100, "recurrent": 244}  # 2.05M and 125k env steps per seed
DEFAULT_SEEDS = {"continuous": [1], "recurrent": [1, 8]}  # 2048 envs already fill a CPU
ONE_DEVICE = "data=1,model=1"


class Candidate(NamedTuple):
    pair: str
    implementation: str
    seeds: int
    env_steps: int  # all seeds
    compile_s: float
    run: Any  # input -> output (timed)
    fresh_input: Any  # -> input (untimed)
    final_return: Any  # output -> float


def masked_mean(returns, done) -> float:
    """Mean of ``returns`` where ``done`` (episodes that ended), NaN when none did."""
    import numpy as np

    returns, done = np.asarray(returns, np.float64), np.asarray(done, bool)
    return float(returns[done].mean()) if done.any() else float("nan")


def rljax_config(pair: str, updates: int):
    from rljax import PPOConfig

    if pair == "continuous":
        return PPOConfig(
            env="Pendulum-v1", num_envs=2048, num_steps=10, total_timesteps=2048 * 10 * updates,
            update_epochs=4, num_minibatches=32, lr=3e-4, anneal_lr=False, gamma=0.99,
            gae_lambda=0.95, clip_eps=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
            actor_widths=(256, 256), critic_widths=(256, 256), activation="tanh",
            normalize_obs=True, normalize_rewards=True,
        )  # fmt: skip
    return PPOConfig(
        env="CartPole-v1", num_envs=4, num_steps=128, total_timesteps=4 * 128 * updates,
        update_epochs=4, num_minibatches=4, lr=2.5e-4, anneal_lr=True, gamma=0.99,
        gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
        activation="relu", **recurrent_fields(),
    )  # fmt: skip


def recurrent_fields() -> dict:
    """PureJaxRL ppo_rnn's network in rljax's terms: a 128 relu embedding, GRU 128, 128 relu
    heads."""
    return {
        "recurrent": "gru",
        "recurrent_width": 128,
        "actor_widths": (128,),
        "critic_widths": (128,),
    }


def baseline(pair: str, updates: int):
    if pair == "continuous":
        from experiments.baselines import purejaxrl_ppo_continuous as module
    else:
        from experiments.baselines import purejaxrl_ppo_rnn as module
    cfg = dict(module.DEFAULT_CONFIG)
    cfg["TOTAL_TIMESTEPS"] = cfg["NUM_ENVS"] * cfg["NUM_STEPS"] * updates
    return module.make_train(cfg), cfg


def rljax_candidate(pair: str, seeds: int, updates: int, mesh_spec: str) -> Candidate | None:
    """rljax on ``mesh_spec``: with several seeds on a multi-device mesh the seeds go on
    ``data`` (each device trains its own), with one seed its batch is split over ``data``.
    None (with the validation's message printed) when the pair's config cannot use the layout,
    e.g. the recurrent pair's 4 envs in 4 whole-sequence minibatches cannot split over 2 shards."""
    import jax
    import numpy as np

    from rljax.errors import ConfigError
    from rljax.parallel import Layout, make_mesh
    from rljax.parallel.rules import seeds_on
    from rljax.run.sharded import ShardedRun

    config = rljax_config(pair, updates)
    mesh = make_mesh(mesh_spec)
    seed_axis = "data" if seeds > 1 and mesh.shape["data"] > 1 else None
    layout = Layout(mesh, seeds_on(seed_axis))
    try:  # a config (not an instance) is validated for the layout before anything compiles
        run = ShardedRun(config, layout, num_seeds=seeds, chunk_size=config.num_updates)
    except ConfigError as e:
        print(f"{pair} seeds={seeds} on {mesh_spec}: skipped, {e}")
        return None
    key = jax.random.key(0)
    run.compile(key)
    steps = config.num_updates * config.batch_size * seeds

    def rljax_final(out):
        return float(np.mean(np.asarray(out[1]["episode_return"][-1])))

    name = "rljax" if mesh_spec == ONE_DEVICE else f"rljax {mesh_spec}"
    name += ", seeds on data" if seed_axis else ""
    return Candidate(
        pair, name, seeds, steps, sum(run.compile_seconds.values()),
        lambda state: run.run_chunk(state, config.num_updates), lambda: run.init(key), rljax_final,
    )  # fmt: skip


def candidates(pair: str, seeds: int, updates: int, meshes: list[str]) -> list[Candidate]:
    """The rljax rows (one per mesh), then the PureJaxRL port's (one device)."""
    import jax
    import numpy as np

    ours = [c for mesh in meshes if (c := rljax_candidate(pair, seeds, updates, mesh))]

    train, cfg = baseline(pair, updates)
    keys = jax.random.key(42) if seeds == 1 else jax.random.split(jax.random.key(42), seeds)
    t0 = time.perf_counter()
    if seeds > 1 and hasattr(train, "init"):
        # The port's own init per seed with lax.map, outside the timed call (as rljax's): its
        # vmapped orthogonal init, a batched LAPACK QR, hung on jaxlib 0.10's CPU backend.
        params = jax.jit(lambda k: jax.lax.map(train.init, k))(keys)
        program = jax.jit(jax.vmap(train)).lower(keys, params).compile()
        inputs, compiled = (keys, params), lambda args: program(*args)
    else:
        inputs = keys
        compiled = jax.jit(train if seeds == 1 else jax.vmap(train)).lower(keys).compile()
    compile_s = time.perf_counter() - t0

    def baseline_final(out):
        info = out["metrics"] if "metrics" in out else out["metric"]  # [(S,) U, T, B]
        last = lambda x: np.asarray(x)[..., -1, :, :]  # noqa: E731
        return masked_mean(last(info["returned_episode_returns"]), last(info["returned_episode"]))

    theirs = Candidate(
        pair, "purejaxrl", seeds, cfg["NUM_ENVS"] * cfg["NUM_STEPS"] * updates * seeds,
        compile_s, compiled, lambda: inputs, baseline_final,
    )  # fmt: skip
    return [*ours, theirs]


def time_alternating(group: list[Candidate], repeats: int) -> list[dict]:
    import jax

    times: list[list[float]] = [[] for _ in group]
    finals = [float("nan")] * len(group)
    for _ in range(repeats):
        for i, c in enumerate(group):
            arg = jax.block_until_ready(c.fresh_input())
            t0 = time.perf_counter()
            out = jax.block_until_ready(c.run(arg))
            times[i].append(time.perf_counter() - t0)
            finals[i] = c.final_return(out)
    rows = []
    for c, t, final in zip(group, times, finals, strict=True):
        rows.append(
            dict(
                pair=c.pair, implementation=c.implementation, seeds=c.seeds,
                compile_s=c.compile_s, run_s=min(t), run_s_all=t, env_steps=c.env_steps,
                steps_per_s=c.env_steps / min(t), final_return=final,
            )
        )  # fmt: skip
        log(
            f"{c.pair:<10} {c.implementation:<9} seeds={c.seeds:<2} compile {c.compile_s:6.2f}s "
            f"run {min(t):7.2f}s {c.env_steps / min(t):>11,.0f} steps/s return {final:8.1f}"
        )
    for r in rows:  # the last row is PureJaxRL's
        r["vs_purejaxrl"] = r["steps_per_s"] / rows[-1]["steps_per_s"]
    return rows


COLUMNS = [
    ("pair", "pair", ""),
    ("implementation", "implementation", ""),
    ("seeds", "seeds", "d"),
    ("compile s", "compile_s", ".2f"),
    ("steps/s", "steps_per_s", ",.0f"),
    ("vs purejaxrl", "vs_purejaxrl", ".2f"),
    ("final training return", "final_return", ".1f"),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default per pair")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--updates", type=int, default=None, help="updates per seed (default per pair)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--meshes",
        nargs="+",
        default=[ONE_DEVICE],
        help="an rljax row per mesh, e.g. data=1,model=1 data=2 (emulated CPU devices; several "
        "seeds go on data, one seed's batch is split over it)",
    )
    args = p.parse_args(argv)
    import math

    from rljax.parallel import set_num_cpu_devices
    from rljax.parallel.mesh import parse_mesh_spec

    set_num_cpu_devices(max(math.prod(parse_mesh_spec(m).values()) for m in args.meshes))

    # Rows of the pairs not run now are kept from the last report (one table for both pairs).
    previous = args.out.with_suffix(".json")
    rows: list[dict] = []
    if previous.exists():
        rows = [r for r in json.loads(previous.read_text())["rows"] if r["pair"] not in args.pairs]
    for pair in args.pairs:
        updates = args.updates or DEFAULT_UPDATES[pair]
        for seeds in args.seeds or DEFAULT_SEEDS[pair]:
            group = candidates(pair, seeds, updates, args.meshes)
            rows += time_alternating(group, args.repeats)
            table = markdown_table(rows, COLUMNS)  # written after every group
            write_report(args.out.with_suffix(".json"), "bench_ppo_family", {"rows": rows})
            args.out.with_suffix(".md").write_text(
                f"# PPO family: rljax vs PureJaxRL\n\n{machine_line()}; best of "
                f"{args.repeats} alternating repeats; compile time separate.\n\n{table}\n"
            )
    print(markdown_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
