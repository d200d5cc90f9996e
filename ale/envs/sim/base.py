"""In-process simulated tool environments: the embedded default for experiments.

Each family is a `SimWorld` (class attributes are the state, `@tool` methods are the
tools — the paper's file-system, billing and e-commerce sandboxes) plus a procedural
generator `generate(rng, difficulty, n_items) -> Scenario` that samples a world, an
instruction, a goal predicate and a scripted expert plan. No Docker, no I/O.

Parameters
- `difficulty`: "easy" (every argument is spelled out in the instruction: a tiny policy
  can learn it by copying), "medium" (the agent must discover ids/paths with lookup
  tools), "hard" (discovery, more distractors and a *crucial fork*: an irreversible tool
  that, chosen too early, makes success impossible — the paper's crucial chunks, M6).
- `horizon`: the number of tool calls the expert needs, submit included. Each family has
  an overhead per difficulty (`overhead`, submit included) and one item (file, refund, purchase) per
  extra call; the plan has exactly `horizon` calls.
- deterministic under `reset(seed=...)`.

Reward: 1.0 when the agent calls `submit` and the goal holds, else 0.0 (on submit or on
the turn limit). `expert_actions()` returns the expert plan as completion texts (the
expert trajectory τ* for M6); `random_action(rng)` samples a random well-formed call.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

import numpy as np

from ale.chat import format_tool_call
from ale.envs.core import EpisodeError, GemEnv
from ale.envs.tools import Tool, collect_tools, render_outcomes, run_action, tool

DIFFICULTIES = ("easy", "medium", "hard")


class SimWorld:
  """Base of simulated worlds: attributes are state, `@tool` methods are tools."""

  submitted: bool = False

  @tool
  def submit(self) -> str:
    """Declares the task finished; the episode ends and the result is checked."""
    self.submitted = True
    return "submitted"

  def vocab(self) -> dict[str, list[Any]]:
    """Plausible values per argument name (for the random agent)."""
    return {}


@dataclasses.dataclass
class Scenario:
  """One generated task: the world, what to do, how success is judged, how to solve it.

  `fork` is the index in `expert` of the first call whose irreversible alternative
  `trap` decides the episode (both None when the scenario has no crucial fork): taking
  `trap` at step `fork` makes the goal unreachable whatever follows.
  """

  world: SimWorld
  instruction: str
  goal: Callable[[SimWorld], bool]
  expert: list[tuple[str, dict[str, Any]]]
  fork: int | None = None
  trap: tuple[str, dict[str, Any]] | None = None


def difficulty_index(difficulty: str | int) -> int:
  if isinstance(difficulty, (int, np.integer)) and 0 <= int(difficulty) < len(DIFFICULTIES):
    return int(difficulty)
  if difficulty in DIFFICULTIES:
    return DIFFICULTIES.index(difficulty)
  raise ValueError(f"difficulty must be one of {DIFFICULTIES} (or 0..2), got {difficulty!r}")


class SimEnv(GemEnv):
  """A simulated tool environment over one family (subclasses set the class attributes).

  Args:
    difficulty: "easy" | "medium" | "hard" (or 0..2).
    horizon: expert tool calls incl. submit (>= `min_horizon[difficulty]`); None picks
      the family's default for the difficulty.
    max_turns: turn limit (truncation); default 2 * horizon + 4.
    render_mode: None or "ansi" (the transcript).
  """

  family: str = ""
  overhead: tuple[int, int, int] = (1, 3, 4)  # expert calls besides the items, submit included
  default_items: tuple[int, int, int] = (1, 2, 3)
  per_item: tuple[int, int, int] = (1, 1, 1)  # expert calls per item

  @classmethod
  def min_horizon(cls, difficulty: str | int) -> int:
    """The shortest horizon a scenario of this difficulty can have (one item)."""
    d = difficulty_index(difficulty)
    return cls.overhead[d] + cls.per_item[d]

  def __init__(
    self,
    difficulty: str | int = "easy",
    horizon: int | None = None,
    max_turns: int | None = None,
    render_mode: str | None = None,
  ):
    super().__init__(render_mode=render_mode, max_obs_chars=1 << 16, max_action_chars=1 << 14)
    self.difficulty = DIFFICULTIES[difficulty_index(difficulty)]
    d = difficulty_index(difficulty)
    if horizon is None:
      horizon = self.overhead[d] + self.per_item[d] * self.default_items[d]
    if horizon < self.min_horizon(d):
      raise ValueError(
        f"{self.family} at difficulty {self.difficulty!r} needs horizon >= {self.min_horizon(d)}, got {horizon}"
      )
    self.horizon = int(horizon)
    self.max_turns = int(max_turns) if max_turns is not None else 2 * self.horizon + 4
    self.scenario: Scenario | None = None
    self._tools: dict[str, Tool] = {}
    self._turn = 0
    self._done = True
    self._counts: dict[str, int] = {}
    self._invalid = 0

  # ---- family hooks -----------------------------------------------------------------
  def generate(self, rng: random.Random, difficulty: int, n_items: int, pad: int) -> Scenario:
    """Samples a scenario with `n_items` items whose expert plan has `pad` extra calls."""
    raise NotImplementedError

  # ---- env ---------------------------------------------------------------------------
  @property
  def tools(self) -> list[dict[str, Any]]:
    """OpenAI-style tool declarations for the current episode."""
    tools = self._tools or collect_tools(
      self.generate(random.Random(0), difficulty_index(self.difficulty), 1, 0).world
    )
    return [t.spec() for t in tools.values()]

  def _items_and_pad(self) -> tuple[int, int]:
    d = difficulty_index(self.difficulty)
    extra = self.horizon - self.overhead[d]
    return extra // self.per_item[d], extra % self.per_item[d]

  def _reset_episode(self, options):
    unknown = set(options) - {"task_seed"}
    if unknown:
      raise ValueError(
        f"unknown reset options {sorted(unknown)}; {type(self).__name__} accepts 'prefix' and 'task_seed'"
      )
    seed = options.get("task_seed")
    if seed is None:
      seed = int(self.np_random.integers(0, 2**31 - 1))
    n_items, pad = self._items_and_pad()
    self.scenario = self.generate(
      random.Random(seed), difficulty_index(self.difficulty), n_items, pad
    )
    assert len(self.scenario.expert) == self.horizon, (len(self.scenario.expert), self.horizon)
    self._tools = collect_tools(self.scenario.world)
    self._turn, self._done, self._counts, self._invalid = 0, False, {}, 0
    info = {
      "family": self.family,
      "difficulty": self.difficulty,
      "horizon": self.horizon,
      "max_turns": self.max_turns,
      "task_seed": seed,
      "fork": self.scenario.fork,
      "tools": self.tools,
    }
    return self.scenario.instruction, info

  def _step(self, action):
    if self.scenario is None or self._done:
      raise EpisodeError(
        "step() called before reset() or after the episode ended; call reset() first"
      )
    self._turn += 1
    outcomes = run_action(action, self._tools)
    for o in outcomes:
      if o.call is not None and o.kind != "invalid":
        self._counts[o.call.name] = self._counts.get(o.call.name, 0) + 1
    invalid = any(o.kind == "invalid" for o in outcomes)
    self._invalid += int(invalid)
    world = self.scenario.world
    terminated = world.submitted
    truncated = not terminated and self._turn >= self.max_turns
    success = bool(self.scenario.goal(world)) if (terminated or truncated) else False
    reward = 1.0 if (terminated and success) else 0.0
    self._done = terminated or truncated
    info = {
      "turn": self._turn,
      "invalid_action": invalid,
      "outcomes": [o.to_info() for o in outcomes],
      "errors": [o.text for o in outcomes if o.kind != "ok"],
      "tool_counts": dict(self._counts),
      "invalid_count": self._invalid,
    }
    if self._done:
      info["success"] = bool(terminated and success)
    return render_outcomes(outcomes), reward, terminated, truncated, info

  # ---- agents for tests and the success table ----------------------------------------
  def expert_actions(self) -> list[str]:
    """The scripted expert's completions for the current episode (τ* for M6)."""
    if self.scenario is None:
      raise RuntimeError("call reset() before expert_actions()")
    return [format_tool_call(name, args) for name, args in self.scenario.expert]

  def trap_actions(self) -> list[str] | None:
    """The expert plan with the crucial fork's irreversible alternative taken at the fork."""
    if self.scenario is None:
      raise RuntimeError("call reset() before trap_actions()")
    sc = self.scenario
    if sc.fork is None:
      return None
    plan = sc.expert[: sc.fork] + [sc.trap] + sc.expert[sc.fork :]
    return [format_tool_call(name, args) for name, args in plan]

  def random_action(self, rng: np.random.Generator) -> str:
    """A random well-formed call: a uniform tool, arguments drawn from the world's vocabulary."""
    if self.scenario is None:
      raise RuntimeError("call reset() before random_action()")
    names = list(self._tools)
    name = names[int(rng.integers(len(names)))]
    vocab = self.scenario.world.vocab()
    schema = self._tools[name].parameters
    args = {}
    for p, spec in schema["properties"].items():
      if "enum" in spec:
        choices = spec["enum"]
      elif p in vocab and vocab[p]:
        choices = vocab[p]
      else:
        choices = {"integer": [1, 2, 3], "number": [1.0], "boolean": [True, False]}.get(
          spec.get("type"), ["x"]
        )
      args[p] = choices[int(rng.integers(len(choices)))]
    return format_tool_call(name, args)


def sentence(rng: random.Random) -> str:
  subjects = ["The team", "Our vendor", "The board", "Support", "Finance", "The client"]
  verbs = ["reviewed", "approved", "postponed", "discussed", "rejected", "updated"]
  objects = [
    "the schedule",
    "the budget",
    "the rollout plan",
    "the contract",
    "the roadmap",
    "the audit",
  ]
  return f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}."


__all__ = ["DIFFICULTIES", "Scenario", "SimEnv", "SimWorld", "difficulty_index", "sentence", "tool"]
