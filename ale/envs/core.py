"""The GEM interface on Gymnasium: text environments, registration, async twins, vector env.

Every environment is a `gymnasium.Env[str, str]`: observations and actions are text.
`reset(seed=None, options=None) -> (obs, info)`, `step(action) -> (obs, reward,
terminated, truncated, info)`, `close()`, and the async twins `areset`, `astep`,
`aclose` for the rollout pipeline (paper: the GEM API of ROCK — make, reset, step, close).

Prefix replay (M6, chunk-level initialised resampling): `reset(options={"prefix":
[action, ...]})` brings a fresh episode to the state after an expert prefix by replaying
the actions; the returned observation is the one after the last prefix action and
`info["prefix_observations"]` holds all of them. Reset with the same seed (and, for the
terminal env, the same task) as the expert run so the replay starts from the same state.
"""

from __future__ import annotations

import asyncio
import copy
import string
import threading
from typing import Any, Callable, Coroutine, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

NAMESPACE = "ale"


class TextSpace(spaces.Text):
  """Any `str` of at most `max_length` characters (Unicode allowed).

  Gymnasium's `Text` restricts characters to a charset; model text and tool output are
  arbitrary Unicode, so `contains` only checks the type and length. `sample` draws short
  printable strings (at most `sample_max_length`), enough for `check_env`.
  """

  def __init__(self, max_length: int = 1 << 20, *, sample_max_length: int = 64, seed=None):
    super().__init__(max_length, min_length=0, charset=string.printable, seed=seed)
    self.sample_max_length = int(sample_max_length)

  def contains(self, x: Any) -> bool:
    return isinstance(x, str) and len(x) <= self.max_length

  def sample(self, mask=None, probability=None) -> str:
    if mask is None and probability is None:
      length = int(self.np_random.integers(0, min(self.max_length, self.sample_max_length) + 1))
      mask = (length, None)
    return super().sample(mask=mask, probability=probability)

  def __eq__(self, other) -> bool:
    return isinstance(other, TextSpace) and other.max_length == self.max_length


class EpisodeError(RuntimeError):
  """An environment was used out of order (step before reset, step after the end)."""


class GemEnv(gym.Env[str, str]):
  """Base class of the text environments.

  Subclasses implement `_reset_episode(options) -> (obs, info)` and `_step(action) ->
  (obs, reward, terminated, truncated, info)` (synchronous), or override the async
  `_areset_episode` / `_astep` (the terminal env) — the sync and async entry points and
  prefix replay are shared here.
  """

  metadata = {"render_modes": ["ansi"], "render_fps": 4}

  def __init__(
    self,
    render_mode: str | None = None,
    *,
    max_obs_chars: int = 1 << 20,
    max_action_chars: int = 1 << 16,
  ):
    if render_mode not in (None, "ansi"):
      raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
    self.render_mode = render_mode
    self.observation_space = TextSpace(max_obs_chars)
    self.action_space = TextSpace(max_action_chars)
    self._transcript: list[str] = []

  # ---- to implement -------------------------------------------------------------
  def _reset_episode(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    raise NotImplementedError

  def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    raise NotImplementedError

  async def _areset_episode(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return self._reset_episode(options)

  async def _astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    return self._step(action)

  # ---- GEM API --------------------------------------------------------------------
  def reset(
    self, *, seed: int | None = None, options: dict[str, Any] | None = None
  ) -> tuple[str, dict[str, Any]]:
    super().reset(seed=seed)
    opts = dict(options or {})
    prefix = _check_prefix(opts.pop("prefix", None))
    obs, info = self._reset_episode(opts)
    self._transcript = [obs]
    prefix_obs = []
    for i, action in enumerate(prefix):
      obs, _, terminated, truncated, step_info = self.step(action)
      prefix_obs.append(obs)
      _check_prefix_step(i, len(prefix), terminated, truncated)
    return obs, _merge_prefix_info(info, prefix, prefix_obs, step_info if prefix else None)

  def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    out = self._step(action)
    self._transcript += [action, out[0]]
    return out

  async def areset(
    self, *, seed: int | None = None, options: dict[str, Any] | None = None
  ) -> tuple[str, dict[str, Any]]:
    """Async twin of `reset` (same semantics, including prefix replay)."""
    gym.Env.reset(self, seed=seed)
    opts = dict(options or {})
    prefix = _check_prefix(opts.pop("prefix", None))
    obs, info = await self._areset_episode(opts)
    self._transcript = [obs]
    prefix_obs = []
    for i, action in enumerate(prefix):
      obs, _, terminated, truncated, step_info = await self.astep(action)
      prefix_obs.append(obs)
      _check_prefix_step(i, len(prefix), terminated, truncated)
    return obs, _merge_prefix_info(info, prefix, prefix_obs, step_info if prefix else None)

  async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Async twin of `step`."""
    out = await self._astep(action)
    self._transcript += [action, out[0]]
    return out

  async def aclose(self) -> None:
    """Async twin of `close`."""
    self.close()

  def render(self) -> str | None:
    if self.render_mode == "ansi":
      return "\n---\n".join(self._transcript)
    return None


def _check_prefix(prefix) -> list[str]:
  if prefix is None:
    return []
  if isinstance(prefix, str) or not all(isinstance(a, str) for a in prefix):
    raise TypeError(
      "options['prefix'] must be a list of action strings (the expert's completions, in order)"
    )
  return list(prefix)


def _check_prefix_step(i: int, n: int, terminated: bool, truncated: bool) -> None:
  if (terminated or truncated) and i < n - 1:
    raise EpisodeError(
      f"prefix action {i} ended the episode but {n - i - 1} prefix actions remain; "
      "a prefix must stop before the episode's final action"
    )


def _merge_prefix_info(info, prefix, prefix_obs, last_step_info) -> dict[str, Any]:
  info = dict(info)
  if prefix:
    info["prefix_len"] = len(prefix)
    info["prefix_observations"] = list(prefix_obs)
    info["prefix_last_step"] = last_step_info
  return info


# ---- one event loop for all async environments used synchronously ----------------
class _LoopThread:
  """A daemon thread running one asyncio loop: sync calls of async envs run here.

  Every sandbox an environment owns is created and used on this loop, whether the caller
  uses the sync API (blocking on the loop) or the async API (awaiting a future bridged
  from it), so clients bound to one loop stay valid.
  """

  def __init__(self):
    self._loop: asyncio.AbstractEventLoop | None = None
    self._lock = threading.Lock()

  @property
  def loop(self) -> asyncio.AbstractEventLoop:
    with self._lock:
      if self._loop is None or self._loop.is_closed():
        loop = asyncio.new_event_loop()
        t = threading.Thread(target=loop.run_forever, name="ale-envs-loop", daemon=True)
        t.start()
        self._loop = loop
      return self._loop

  def run(self, coro: Coroutine):
    """Blocks until `coro` finished on the env loop; returns its result."""
    try:
      running = asyncio.get_running_loop()
    except RuntimeError:
      running = None
    if running is self.loop:
      coro.close()
      raise EpisodeError(
        "a sync env method was called from the env loop itself; use the async twin"
      )
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

  async def arun(self, coro: Coroutine):
    """Awaits `coro` on the env loop from any other loop."""
    if asyncio.get_running_loop() is self.loop:
      return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


ENV_LOOP = _LoopThread()


class AsyncGemEnv(GemEnv):
  """A GemEnv whose work is async (I/O to sandboxes); the sync API blocks on `ENV_LOOP`.

  Subclasses implement `_areset_episode`, `_astep` and `_aclose`.
  """

  def _reset_episode(self, options):
    return ENV_LOOP.run(self._areset_episode(options))

  def _step(self, action):
    return ENV_LOOP.run(self._astep(action))

  async def areset(self, *, seed=None, options=None):
    return await ENV_LOOP.arun(GemEnv.areset(self, seed=seed, options=options))

  async def astep(self, action):
    return await ENV_LOOP.arun(GemEnv.astep(self, action))

  def reset(self, *, seed=None, options=None):
    return ENV_LOOP.run(GemEnv.areset(self, seed=seed, options=options))

  def step(self, action):
    return ENV_LOOP.run(GemEnv.astep(self, action))

  async def _aclose(self) -> None:
    pass

  def close(self) -> None:
    ENV_LOOP.run(self._aclose())

  async def aclose(self) -> None:
    await ENV_LOOP.arun(self._aclose())


# ---- registration -------------------------------------------------------------------
_REGISTERED: dict[str, str] = {}


def register(
  env_id: str, entry_point: str, *, nondeterministic: bool = False, **kwargs: Any
) -> None:
  """Registers `env_id` (e.g. "ale/SimFiles-v0") with gymnasium and with `list_envs`."""
  if not env_id.startswith(NAMESPACE + "/"):
    raise ValueError(f"env ids live in the '{NAMESPACE}/' namespace, got {env_id!r}")
  if env_id not in gym.registry:
    gym.register(
      id=env_id, entry_point=entry_point, nondeterministic=nondeterministic, kwargs=kwargs or None
    )
  _REGISTERED[env_id] = entry_point


def list_envs() -> list[str]:
  """The registered ale environment ids."""
  return sorted(_REGISTERED)


def make(env_id: str, **kwargs: Any) -> GemEnv:
  """Creates a registered environment, unwrapped (so `areset`/`astep` are reachable).

  `gymnasium.make(env_id)` also works but returns the env inside gymnasium's checker
  wrappers, which hide the async twins.
  """
  if env_id not in _REGISTERED:
    raise KeyError(f"unknown env id {env_id!r}; registered: {list_envs()}")
  spec: EnvSpec = gym.registry[env_id]
  merged = {**(spec.kwargs or {}), **kwargs}
  env = gym.envs.registration.load_env_creator(spec.entry_point)(**merged)
  env.unwrapped.spec = copy.deepcopy(spec)
  env.unwrapped.spec.kwargs = merged
  return env


# ---- vector env ---------------------------------------------------------------------
class GemVectorEnv:
  """Steps many environments concurrently (each its own instance, task and sandbox).

  No autoreset: a finished slot keeps returning its final observation until reset.
  Results are lists (observations, infos) and arrays (rewards, terminated, truncated).
  """

  def __init__(self, envs: Sequence[GemEnv] | Sequence[Callable[[], GemEnv]]):
    self.envs = [e() if callable(e) and not isinstance(e, gym.Env) else e for e in envs]
    if not self.envs:
      raise ValueError("GemVectorEnv needs at least one env")
    self.num_envs = len(self.envs)

  def __len__(self) -> int:
    return self.num_envs

  async def areset(
    self,
    *,
    seed: int | Sequence[int | None] | None = None,
    options: dict | Sequence[dict | None] | None = None,
  ):
    seeds = _per_env(seed, self.num_envs, "seed", lambda s: [s + i for i in range(self.num_envs)])
    opts = _per_env(options, self.num_envs, "options", lambda o: [o] * self.num_envs)
    res = await asyncio.gather(
      *(e.areset(seed=s, options=o) for e, s, o in zip(self.envs, seeds, opts, strict=False))
    )
    return [r[0] for r in res], [r[1] for r in res]

  async def astep(self, actions: Sequence[str | None]):
    """Steps env i with actions[i]; None skips a slot (its result is None/0/False)."""
    if len(actions) != self.num_envs:
      raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")

    async def one(env, a):
      if a is None:
        return None, 0.0, False, False, {"skipped": True}
      return await env.astep(a)

    res = await asyncio.gather(*(one(e, a) for e, a in zip(self.envs, actions, strict=False)))
    obs = [r[0] for r in res]
    rew = np.asarray([r[1] for r in res], dtype=np.float32)
    term = np.asarray([r[2] for r in res], dtype=bool)
    trunc = np.asarray([r[3] for r in res], dtype=bool)
    return obs, rew, term, trunc, [r[4] for r in res]

  async def aclose(self) -> None:
    await asyncio.gather(*(e.aclose() for e in self.envs))

  def reset(self, *, seed=None, options=None):
    return _run_blocking(self.areset(seed=seed, options=options))

  def step(self, actions):
    return _run_blocking(self.astep(actions))

  def close(self) -> None:
    _run_blocking(self.aclose())


def _run_blocking(coro):
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coro)
  coro.close()
  raise EpisodeError(
    "GemVectorEnv sync methods cannot run inside an event loop; await areset/astep/aclose"
  )


def _per_env(value, n, name, broadcast):
  if value is None:
    return [None] * n
  if isinstance(value, (int, np.integer)) and name == "seed":
    return broadcast(int(value))
  if isinstance(value, dict):
    return broadcast(value)
  value = list(value)
  if len(value) != n:
    raise ValueError(f"{name} must be one value or one per env ({n}), got {len(value)}")
  return value
