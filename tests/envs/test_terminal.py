"""Terminal environment over real Docker sandboxes (skips without an engine, fails in CI)."""

import asyncio
import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from ale.chat import format_tool_call as call
from ale.envs import GemVectorEnv, make

pytestmark = pytest.mark.docker


@pytest.fixture
def env(base_image):
  e = make("ale/Terminal-v0", bash_timeout_s=5)
  yield e
  e.close()


def test_check_env_terminal(base_image):
  env = make("ale/Terminal-v0")
  with warnings.catch_warnings():
    warnings.simplefilter(
      "ignore"
    )  # nondeterministic=True skips determinism checks; spec warnings only
    check_env(env.unwrapped)
  env.close()


def test_tools_and_reward(env):
  obs, info = env.reset(seed=0, options={"task": "replace-deprecated-api"})
  assert (
    "old_fetch" in obs and info["task"] == "replace-deprecated-api" and info["adaptations"] == []
  )
  assert [t["function"]["name"] for t in info["tools"]] == [
    "bash",
    "read_file",
    "write_file",
    "edit",
    "ls",
    "grep",
    "submit",
  ]
  o, *_, i = env.step(call("bash", {"command": "ls /tests 2>&1; echo $PWD"}))
  assert (
    "No such file or directory" in o and "/workspace" in o
  )  # tests are never visible to the agent
  o, *_ = env.step(call("grep", {"pattern": "old_fetch\\(", "path": "src"}))
  assert "src/api/client.py:7:" in o and "src/main.py" in o
  o, *_ = env.step(call("read_file", {"path": "src/main.py", "start_line": 3, "end_line": 3}))
  assert o == 'a = old_fetch("x")\n'
  o, *_ = env.step(
    call("edit", {"path": "src/main.py", "search": "old_fetch(", "replace": "fetch_v2("})
  )
  assert "occurs 2 times" in o
  o, *_ = env.step(
    call("edit", {"path": "src/main.py", "search": 'old_fetch("x")', "replace": 'fetch_v2("x")'})
  )
  assert o == "edited src/main.py"
  o, *_ = env.step(
    call(
      "write_file",
      {
        "path": "src/api/client.py",
        "content": 'old_fetcher = 1\ndef get(u):\n  return fetch_v2(u) + fetch_v2(u + "/2")\n',
      },
    )
  )
  assert o.startswith("wrote")
  o, *_ = env.step(call("ls", {"path": "src/api"}))
  assert "client.py" in o
  o, r, te, tr, i = env.step(call("bash", {"command": "sleep 30", "timeout_s": 2}))
  assert "timed out after 2s" in o and not (te or tr)
  o, r, te, tr, i = env.step("I think I am done")
  assert i["invalid_action"] and "no tool call found" in o
  # one call still left: the tests must fail now (main.py has a second old_fetch)
  o, r, te, tr, i = env.step(call("submit", {}))
  assert (
    te
    and not tr
    and r == 0.0
    and i["tests"]["passed"] is False
    and "old_fetch calls left" in i["tests"]["output"]
  )
  assert i["tool_counts"]["edit"] == 2 and i["durations"]["tests_s"] > 0 and i["all_errors"]


def test_solved_episode_and_turn_limit(base_image):
  env = make("ale/Terminal-v0", max_turns=2)
  _, info = env.reset(seed=1, options={"task": "csv-column-sum"})
  o, r, te, tr, i = env.step(
    call(
      "bash",
      {
        "command": 'awk -F, \'NR>1 && $3=="paid" {s+=$4} END {printf "%.2f\\n", s}\' sales.csv > total.txt'
      },
    )
  )
  assert not (te or tr)
  o, r, te, tr, i = env.step(call("ls", {}))  # no submit: the turn limit ends it, tests still judge
  assert tr and not te and i["truncated_by"] == "turn limit" and r == 1.0 and i["success"]
  env.close()


def _run(env, actions, seed, options):
  out = [env.reset(seed=seed, options=options)[0]]
  for a in actions:
    o, r, te, tr, i = env.step(a)
    out.append((o, r, te, tr, i.get("tests", {}).get("passed")))
  return out


@pytest.mark.parametrize("snapshot", [False, True])
def test_prefix_replay_equals_original_run(base_image, snapshot):
  env = make("ale/Terminal-v0", snapshot_prefixes=snapshot)
  actions = [
    call(
      "bash",
      {
        "command": "mkdir -p /workspace/logs/old && cd /workspace/logs && gzip app-2024-05-01.log && ls"
      },
    ),
    call("write_file", {"path": "logs/notes.txt", "content": "rotated 1\n"}),
    call(
      "bash",
      {"command": "cd logs && gzip app-2024-05-02.log app-2024-05-03.log && ls && cat notes.txt"},
    ),
    call("submit", {}),
  ]
  opts = {"task": "rotate-logs"}
  original = _run(env, actions, 3, opts)
  assert original[-1][1] == 1.0
  for k in (2, 3) if not snapshot else (2, 2):
    obs, info = env.reset(seed=3, options={**opts, "prefix": actions[:k]})
    assert obs == original[k][0] and info["prefix_len"] == k
    rest = [env.step(a) for a in actions[k:]]
    assert [
      (o, r, te, tr, i.get("tests", {}).get("passed")) for o, r, te, tr, i in rest
    ] == original[k + 1 :]
  if snapshot:
    assert "restored_snapshot" in info  # the second reset started from the committed state
  env.close()


def test_vector_terminal_envs_step_concurrently(base_image):
  async def go():
    vec = GemVectorEnv([lambda: make("ale/Terminal-v0") for _ in range(3)])
    tasks = ["symlink-config", "sqlite-top-customer", "json-to-csv"]
    obs, infos = await vec.areset(options=[{"task": t} for t in tasks])
    assert [i["task"] for i in infos] == tasks
    o, r, te, tr, i = await vec.astep([call("bash", {"command": "sleep 1; echo done"})] * 3)
    assert all("done" in x for x in o) and max(x["durations"]["step_s"] for x in i) < 3.0
    o, r, te, tr, i = await vec.astep([call("submit", {})] * 3)
    assert te.all() and (r == 0.0).all()
    await vec.aclose()

  asyncio.run(go())
