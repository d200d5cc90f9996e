"""Simulated tool environments: GEM/Gymnasium contract, determinism, expert/random
success, crucial forks, prefix replay (M6), vector and async use."""

import asyncio
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import ale.envs
from ale.chat import format_tool_call
from ale.envs import GemVectorEnv, make
from ale.envs.sim import DIFFICULTIES, FAMILIES
from ale.envs.sim.report import format_table, run_expert, run_random, success_table

SIM_IDS = {"files": "ale/SimFiles-v0", "billing": "ale/SimBilling-v0", "shop": "ale/SimShop-v0"}


def test_registered_ids():
  ids = ale.envs.list_envs()
  assert set(SIM_IDS.values()) | {"ale/Terminal-v0"} <= set(ids)
  env = gym.make("ale/SimFiles-v0", difficulty="medium")  # gymnasium's own make works too
  obs, _ = env.reset(seed=0)
  assert isinstance(obs, str) and "/inbox" in obs
  with pytest.raises(KeyError, match="unknown env id"):
    make("ale/Nope-v0")


@pytest.mark.parametrize("env_id", sorted(SIM_IDS.values()))
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_check_env(env_id, difficulty):
  env = make(env_id, difficulty=difficulty)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # any checker warning fails the test
    check_env(env.unwrapped)


def _rollout(env, actions, seed):
  obs, info = env.reset(seed=seed)
  trace = [obs]
  for a in actions:
    o, r, te, tr, i = env.step(a)
    trace.append((o, r, te, tr, i))
    if te or tr:
      break
  return trace


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_deterministic_under_seed(family):
  env = FAMILIES[family](difficulty="hard")
  a = env.reset(seed=7)[0], env.expert_actions()
  b = env.reset(seed=7)[0], env.expert_actions()
  c = env.reset(seed=8)[0], env.expert_actions()
  assert a == b and a != c
  rng = np.random.default_rng(0)
  acts = [env.random_action(rng) for _ in range(6)]
  assert _rollout(env, acts, 3) == _rollout(env, acts, 3)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_expert_solves_every_difficulty_and_horizon(family, difficulty):
  cls = FAMILIES[family]
  lo = cls.min_horizon(difficulty)
  for horizon in (lo, lo + 1, lo + 4):
    env = cls(difficulty=difficulty, horizon=horizon)
    for seed in range(10):
      obs, info = env.reset(seed=seed)
      assert info["horizon"] == horizon == len(env.expert_actions())
      assert run_expert(env, seed), (family, difficulty, horizon, seed, obs)
  with pytest.raises(ValueError, match="needs horizon >="):
    cls(difficulty=difficulty, horizon=lo - 1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_crucial_fork_decides_success(family):
  """Hard scenarios have an early irreversible alternative that makes the goal unreachable."""
  env = FAMILIES[family](difficulty="hard")
  for seed in range(10):
    _, info = env.reset(seed=seed)
    assert info["fork"] is not None and info["fork"] <= 1  # an early choice
    trap = env.trap_actions()
    final = _rollout(env, trap, seed)[-1]
    assert final[2] and final[1] == 0.0 and final[4]["success"] is False
  for d in ("easy", "medium"):
    env = FAMILIES[family](difficulty=d)
    env.reset(seed=0)
    assert env.trap_actions() is None


def test_random_agent_mostly_fails_hard():
  rows = success_table(episodes=40, seed=100)
  table = format_table(rows)
  for r in rows:
    assert r["expert"] == 1.0, table
    if r["difficulty"] == "hard":
      assert r["random"] <= 0.1, table


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefix_replay_equals_original_run(family):
  env = FAMILIES[family](difficulty="hard")
  env.reset(seed=11)
  expert = env.expert_actions()
  rng = np.random.default_rng(1)
  actions = expert[:3] + [env.random_action(rng)] + expert[3:]
  original = _rollout(env, actions, seed=11)
  for k in range(0, len(actions)):
    obs, info = env.reset(seed=11, options={"prefix": actions[:k]})
    assert obs == (original[k] if k == 0 else original[k][0])
    if k:
      assert info["prefix_len"] == k and info["prefix_observations"] == [
        t[0] for t in original[1 : k + 1]
      ]
    rest = []
    for a in actions[k:]:
      rest.append(env.step(a))
      if rest[-1][2] or rest[-1][3]:
        break
    assert rest == original[k + 1 :]


def test_prefix_must_not_end_the_episode():
  env = make("ale/SimFiles-v0")
  env.reset(seed=0)
  plan = env.expert_actions()
  with pytest.raises(ale.envs.EpisodeError, match="ended the episode"):
    env.reset(seed=0, options={"prefix": plan + plan})
  with pytest.raises(TypeError, match="list of action strings"):
    env.reset(seed=0, options={"prefix": "ls"})


def test_invalid_actions_never_raise_and_are_flagged():
  env = make("ale/SimBilling-v0", difficulty="medium")
  env.reset(seed=0)
  for bad in [
    "",
    "hello",
    "<tool_call>{",
    format_tool_call("refund", {}),
    format_tool_call("fly", {"to": "moon"}),
  ]:
    obs, r, te, tr, info = env.step(bad)
    assert info["invalid_action"] and obs and r == 0.0
  obs, r, te, tr, info = env.step(format_tool_call("refund", {"invoice_id": "INV-1"}))
  assert not info["invalid_action"] and obs.startswith("error: no invoice")
  assert info["invalid_count"] == 5 and info["tool_counts"] == {"refund": 1}


def test_turn_limit_truncates():
  env = make("ale/SimShop-v0", max_turns=3)
  env.reset(seed=0)
  outs = [env.step(format_tool_call("view_cart", {})) for _ in range(3)]
  assert [o[3] for o in outs] == [False, False, True]
  assert outs[-1][4]["success"] is False and outs[-1][1] == 0.0
  with pytest.raises(ale.envs.EpisodeError):
    env.step(format_tool_call("view_cart", {}))


def test_vector_env_and_async_twins():
  envs = GemVectorEnv([lambda f=f: make(SIM_IDS[f], difficulty="medium") for f in sorted(FAMILIES)])
  obs, infos = envs.reset(seed=5)
  assert len(obs) == 3 and all(isinstance(o, str) for o in obs)
  plans = [e.expert_actions() for e in envs.envs]
  done = np.zeros(3, bool)
  rewards = np.zeros(3)
  for t in range(max(map(len, plans))):
    acts = [p[t] if t < len(p) and not d else None for p, d in zip(plans, done, strict=False)]
    _, r, te, tr, _ = envs.step(acts)
    rewards += r
    done |= te | tr
  assert done.all() and (rewards == 1.0).all()

  async def go():
    env = make("ale/SimFiles-v0")
    obs, _ = await env.areset(seed=2)
    for a in env.expert_actions():
      out = await env.astep(a)
    await env.aclose()
    return out

  assert asyncio.run(go())[1] == 1.0


def test_report_runs():
  env = FAMILIES["files"](difficulty="easy")
  assert run_expert(env, 0) and isinstance(run_random(env, 0), bool)
