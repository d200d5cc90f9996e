"""Success table of the simulated families: scripted expert vs random agent.

    python -m ale.envs.sim.report [--episodes 50] [--seed 0]

For each family and difficulty (default horizon) it runs the scripted expert plan and a
uniformly random tool-calling agent for `episodes` seeds and prints one table of success
rates. The expert must solve every setting; the random agent mostly fails the hard ones.
"""

from __future__ import annotations

import argparse

import numpy as np

from ale.envs.sim import DIFFICULTIES, FAMILIES


def run_expert(env, seed: int) -> bool:
  env.reset(seed=seed)
  info = {}
  for a in env.expert_actions():
    _, _, term, trunc, info = env.step(a)
    if term or trunc:
      break
  return bool(info.get("success", False))


def run_random(env, seed: int) -> bool:
  env.reset(seed=seed)
  rng = np.random.default_rng(seed)
  while True:
    _, _, term, trunc, info = env.step(env.random_action(rng))
    if term or trunc:
      return bool(info.get("success", False))


def success_table(episodes: int = 50, seed: int = 0) -> list[dict]:
  """Rows {family, difficulty, horizon, expert, random} of success rates in [0, 1]."""
  rows = []
  for fam, cls in FAMILIES.items():
    for diff in DIFFICULTIES:
      env = cls(difficulty=diff)
      seeds = range(seed, seed + episodes)
      rows.append(
        {
          "family": fam,
          "difficulty": diff,
          "horizon": env.horizon,
          "expert": float(np.mean([run_expert(env, s) for s in seeds])),
          "random": float(np.mean([run_random(env, s) for s in seeds])),
        }
      )
  return rows


def format_table(rows: list[dict]) -> str:
  lines = [f"{'family':<8} {'difficulty':<10} {'horizon':>7} {'expert':>7} {'random':>7}"]
  for r in rows:
    lines.append(
      f"{r['family']:<8} {r['difficulty']:<10} {r['horizon']:>7} {r['expert']:>7.2f} {r['random']:>7.2f}"
    )
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--episodes", type=int, default=50)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  print(format_table(success_table(a.episodes, a.seed)))


if __name__ == "__main__":
  main()
