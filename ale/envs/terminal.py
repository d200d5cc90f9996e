"""Terminal environment: one Docker sandbox per episode over a task instance.

The agent acts with tools — `bash` (with a timeout), `read_file`, `write_file`, `edit`
(search/replace block), `ls`, `grep` and `submit` — in a container built from the task's
Dockerfile (through `ale.sandbox`: the embedded service on the local Docker engine, or a
remote sandbox service when `sandbox_url` is given). The episode ends on `submit`
(terminated), on the turn limit or on the wall-clock limit (truncated). Only then are the
task's tests copied in (never visible to the agent) and run; the reward is 1/0 from the
tests and `info` carries their output, durations, tool counts and errors.

Prefix replay (M6): `reset(options={"prefix": actions, "task": name})` replays an expert
prefix in a fresh sandbox. With `snapshot_prefixes=True` the state after a prefix is
committed to an image the first time (`Sandbox.commit`) and later resets with the same
task and prefix start from that snapshot instead of replaying.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import posixpath
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

from ale.envs.core import AsyncGemEnv
from ale.envs.tasks import Task, builtin_tasks, load_task, run_tests, staged_context
from ale.envs.tools import Tool, ToolError, arun_action, render_outcomes

MAX_TOOL_OUTPUT = 16_000


def _clip(text: str, limit: int = MAX_TOOL_OUTPUT) -> str:
  if len(text) <= limit:
    return text
  half = limit // 2
  return f"{text[:half]}\n... [{len(text) - limit} characters omitted] ...\n{text[-half:]}"


# One image build per task per process (build_image hashes the context; this skips even that).
_IMAGE_CACHE: dict[tuple[str, str], tuple[str, list[str]]] = {}
_BUILD_LOCKS: dict[str, asyncio.Lock] = {}


def image_exists(tag: str) -> bool:
  """Whether the local Docker engine has `tag` (nothing is ever pulled)."""
  import docker

  dc = docker.from_env(timeout=60)
  try:
    dc.images.get(tag)
    return True
  except docker.errors.ImageNotFound:
    return False
  finally:
    dc.close()


async def build_task_image(task: Task) -> tuple[str, list[str]]:
  """Builds (or finds cached) the task's adapted image. Returns (tag, adaptations)."""
  import shutil

  from ale.sandbox import build_image

  key = (str(task.path), str(task.dockerfile.stat().st_mtime_ns))
  if key in _IMAGE_CACHE:
    return _IMAGE_CACHE[key]
  lock = _BUILD_LOCKS.setdefault(str(task.path), asyncio.Lock())
  async with lock:
    if key in _IMAGE_CACHE:
      return _IMAGE_CACHE[key]

    def build():
      ctx, adaptations = staged_context(task, image_exists=image_exists)
      try:
        return build_image(ctx, tag_prefix="ale/task"), adaptations
      except Exception as e:
        raise ImageBuildError(
          f"building the image of task {task.name} failed: {e}", adaptations
        ) from None
      finally:
        shutil.rmtree(ctx, ignore_errors=True)

    result = await asyncio.to_thread(build)
    _IMAGE_CACHE[key] = result
    return result


_CLIENTS: dict[str | None, Any] = {}


async def shared_client(url: str | None = None):
  """The process-wide sandbox client for `url` (None: embedded service), on `ENV_LOOP`.

  Every terminal env and validation run shares it, so one embedded service manages all
  task sandboxes of a process; environments delete their own sandboxes on episode end
  and on close. `close_shared_clients()` (also registered at exit) shuts it down.
  """
  from ale.envs.core import ENV_LOOP

  if asyncio.get_running_loop() is not ENV_LOOP.loop:
    return await ENV_LOOP.arun(shared_client(url))
  if url not in _CLIENTS:
    from ale.sandbox import Client

    _CLIENTS[url] = Client(url) if url else Client()
  return _CLIENTS[url]


async def _close_clients() -> None:
  clients = list(_CLIENTS.values())
  _CLIENTS.clear()
  for c in clients:
    try:
      await c.close()
    except Exception:  # best effort at shutdown; leftovers are reaped by the next service
      pass


def close_shared_clients(timeout_s: float = 15.0) -> None:
  """Closes the shared sandbox clients, waiting at most `timeout_s` (never hangs exit)."""
  import concurrent.futures

  from ale.envs.core import ENV_LOOP

  if _CLIENTS:
    fut = asyncio.run_coroutine_threadsafe(_close_clients(), ENV_LOOP.loop)
    try:
      fut.result(timeout=timeout_s)
    except (concurrent.futures.TimeoutError, Exception):
      fut.cancel()


atexit.register(close_shared_clients)


class ImageBuildError(RuntimeError):
  """A task image failed to build; carries the Dockerfile adaptations applied."""

  def __init__(self, message: str, adaptations: list[str]):
    super().__init__(message)
    self.adaptations = list(adaptations)


class TerminalEnv(AsyncGemEnv):
  """GEM terminal environment over task instances (`ale/Terminal-v0`).

  Args:
    tasks: task directories or `Task`s; None uses the built-in suite. `reset` picks one
      with `options["task"]` (name or index) or uniformly from the seeded RNG.
    task: a single task (shortcut for `tasks=[task]`).
    sandbox_url: URL of a sandbox service; None embeds one over the local Docker engine.
    max_turns: turn limit (default: the task's).
    wall_clock_s: episode time limit (default: the task's agent timeout).
    bash_timeout_s: default and maximum timeout of one `bash` call.
    test_on_truncate: run the tests (and give their reward) when the episode is
      truncated, not only on submit.
    snapshot_prefixes: commit the state after a replayed prefix and reuse it.
  """

  def __init__(
    self,
    tasks: Sequence[str | Path | Task] | None = None,
    *,
    task: str | Path | Task | None = None,
    sandbox_url: str | None = None,
    max_turns: int | None = None,
    wall_clock_s: float | None = None,
    bash_timeout_s: float = 60.0,
    test_on_truncate: bool = True,
    snapshot_prefixes: bool = False,
    render_mode: str | None = None,
  ):
    super().__init__(render_mode=render_mode)
    if task is not None:
      tasks = [task]
    self.tasks: list[Task] = (
      [t if isinstance(t, Task) else load_task(t) for t in tasks]
      if tasks is not None
      else builtin_tasks()
    )
    if not self.tasks:
      raise ValueError("TerminalEnv needs at least one task")
    self.sandbox_url = sandbox_url
    self._max_turns = max_turns
    self._wall_clock_s = wall_clock_s
    self.bash_timeout_s = float(bash_timeout_s)
    self.test_on_truncate = test_on_truncate
    self.snapshot_prefixes = snapshot_prefixes
    self._sb = None
    self.task: Task | None = None
    self._done = True
    self._snapshots: dict[str, str] = {}
    self._snapshot_obs: dict[str, str] = {}
    self._tools = self._make_tools()

  # ---- sandbox plumbing -----------------------------------------------------------
  async def _client_(self):
    return await shared_client(self.sandbox_url)

  async def _drop_sandbox(self) -> None:
    sb, self._sb = self._sb, None
    if sb is not None:
      await sb.close()

  async def _aclose(self) -> None:
    await self._drop_sandbox()
    if self._snapshots:
      from ale.sandbox import remove_image

      for tag in self._snapshots.values():
        try:
          await asyncio.to_thread(remove_image, tag, force=True)
        except ValueError:
          pass
      self._snapshots.clear()
      self._snapshot_obs.clear()

  def _pick(self, options: dict[str, Any]) -> Task:
    sel = options.get("task")
    if sel is None:
      return self.tasks[int(self.np_random.integers(len(self.tasks)))]
    if isinstance(sel, int):
      return self.tasks[sel]
    for t in self.tasks:
      if t.name == sel:
        return t
    raise KeyError(f"no task named {sel!r}; available: {[t.name for t in self.tasks]}")

  def _abs(self, path: str) -> str:
    return posixpath.normpath(posixpath.join(self.task.workdir, path))

  # ---- tools ------------------------------------------------------------------------
  def _make_tools(self) -> dict[str, Tool]:
    def t(name, desc, props, required, fn):
      return Tool(
        name,
        desc,
        {
          "type": "object",
          "properties": props,
          "required": required,
          "additionalProperties": False,
        },
        fn,
      )

    s = {"type": "string"}
    return {
      "bash": t(
        "bash",
        f"Runs a bash command in the task container (cwd: the task's working directory) and returns its output and exit code. Default timeout {self.bash_timeout_s:.0f}s.",
        {
          "command": {**s, "description": "the command"},
          "timeout_s": {
            "type": "number",
            "description": f"seconds (max {self.bash_timeout_s:.0f})",
          },
        },
        ["command"],
        self._bash,
      ),
      "read_file": t(
        "read_file",
        "Returns a text file's content (optionally a range of lines, 1-based).",
        {"path": s, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
        ["path"],
        self._read_file,
      ),
      "write_file": t(
        "write_file",
        "Creates or overwrites a file (parent directories are created).",
        {"path": s, "content": s},
        ["path", "content"],
        self._write_file,
      ),
      "edit": t(
        "edit",
        "Replaces one exact occurrence of `search` in a file with `replace` (a search/replace block; `search` must match exactly once).",
        {"path": s, "search": s, "replace": s},
        ["path", "search", "replace"],
        self._edit,
      ),
      "ls": t(
        "ls",
        "Lists a directory (ls -la).",
        {"path": {**s, "description": "default: the working directory"}},
        [],
        self._ls,
      ),
      "grep": t(
        "grep",
        "Searches files recursively for a regular expression (grep -rnE); shows at most 200 matching lines.",
        {"pattern": s, "path": {**s, "description": "default: the working directory"}},
        ["pattern"],
        self._grep,
      ),
      "submit": t(
        "submit",
        "Declares the task finished; the episode ends and the tests run.",
        {},
        [],
        self._submit,
      ),
    }

  @property
  def tools(self) -> list[dict[str, Any]]:
    """OpenAI-style declarations of the agent's tools."""
    return [tool.spec() for tool in self._tools.values()]

  async def _exec(self, cmd: str, timeout_s: float):
    self._counts_exec += 1
    return await self._sb.exec(
      cmd,
      timeout_s=timeout_s,
      cwd=self.task.workdir,
      env={"HOME": "/root" if self.task.user == "root" else "/tmp"},
    )

  async def _bash(self, command: str, timeout_s: float | None = None) -> str:
    limit = (
      self.bash_timeout_s
      if timeout_s is None
      else max(1.0, min(float(timeout_s), self.bash_timeout_s))
    )
    r = await self._exec(command, limit)
    out = r.stdout + (
      ("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr if r.stderr else ""
    )
    tail = f"[exit code {r.exit_code}]"
    if r.timed_out:
      tail = f"[timed out after {limit:.0f}s; the command was killed]"
    if r.truncated:
      tail += " [output truncated]"
    return f"{_clip(out)}{'' if not out or out.endswith(chr(10)) else chr(10)}{tail}"

  async def _read_file(
    self, path: str, start_line: int | None = None, end_line: int | None = None
  ) -> str:
    p = self._abs(path)
    r = await self._exec(
      f"if [ -d {shlex.quote(p)} ]; then echo DIR; elif [ -f {shlex.quote(p)} ]; then echo FILE; else echo NONE; fi",
      30,
    )
    kind = r.stdout.strip()
    if kind == "DIR":
      raise ToolError(f"{path} is a directory; list it with ls")
    if kind != "FILE":
      raise ToolError(f"no such file: {path}")
    data = (await self._sb.read(p)).decode("utf-8", errors="replace")
    if start_line is not None or end_line is not None:
      lines = data.splitlines(keepends=True)
      lo = max(1, start_line or 1)
      data = "".join(lines[lo - 1 : end_line])
    return _clip(data) if data else "(empty file)"

  async def _write_file(self, path: str, content: str) -> str:
    p = self._abs(path)
    r = await self._exec(f"stat -c %a {shlex.quote(p)} 2>/dev/null || true", 30)
    mode = int(r.stdout.strip(), 8) if r.stdout.strip() else 0o644
    await self._sb.write(p, content.encode(), mode=mode)
    return f"wrote {len(content.encode())} bytes to {path}"

  async def _edit(self, path: str, search: str, replace: str) -> str:
    p = self._abs(path)
    if not search:
      raise ToolError("search is empty; give the exact text to replace")
    r = await self._exec(f"test -f {shlex.quote(p)} && stat -c %a {shlex.quote(p)}", 30)
    if r.exit_code != 0:
      raise ToolError(f"no such file: {path}")
    text = (await self._sb.read(p)).decode("utf-8", errors="replace")
    n = text.count(search)
    if n == 0:
      raise ToolError(
        f"search text not found in {path}; read the file and copy the text exactly (whitespace included)"
      )
    if n > 1:
      raise ToolError(
        f"search text occurs {n} times in {path}; include more surrounding lines so it matches exactly once"
      )
    await self._sb.write(
      p, text.replace(search, replace, 1).encode(), mode=int(r.stdout.strip(), 8)
    )
    return f"edited {path}"

  async def _ls(self, path: str = ".") -> str:
    r = await self._exec(f"ls -la -- {shlex.quote(self._abs(path))}", 30)
    if r.exit_code != 0:
      raise ToolError(r.stderr.strip() or f"cannot list {path}")
    return _clip(r.stdout)

  async def _grep(self, pattern: str, path: str = ".") -> str:
    r = await self._exec(
      f"grep -rnE -- {shlex.quote(pattern)} {shlex.quote(self._abs(path))} | head -n 200", 60
    )
    if r.stderr.strip() and not r.stdout:
      raise ToolError(r.stderr.strip())
    return _clip(r.stdout) if r.stdout else "no matches"

  async def _submit(self) -> str:
    self._submitted = True
    return "submitted; running the tests"

  # ---- episode ----------------------------------------------------------------------
  async def _areset_episode(self, options):
    unknown = set(options) - {"task", "_prefix_key"}
    if unknown:
      raise ValueError(
        f"unknown reset options {sorted(unknown)}; TerminalEnv accepts 'task' and 'prefix'"
      )
    await self._drop_sandbox()
    self.task = self._pick(options)
    t0 = time.monotonic()
    image, adaptations = await build_task_image(self.task)
    t_build = time.monotonic() - t0
    snap = self._snapshots.get(options.get("_prefix_key", ""))
    client = await self._client_()
    self._sb = await client.create(
      image,
      cpus=self.task.cpus,
      memory_mb=self.task.memory_mb,
      pids=self.task.pids,
      network="none",
      workdir=self.task.workdir,
      user=self.task.user,
      read_only=False,
      from_snapshot=snap,
    )
    self._turn, self._done, self._submitted = 0, False, False
    self._counts: dict[str, int] = {}
    self._counts_exec = 0
    self._errors: list[str] = []
    self._tool_s = 0.0
    self._t_start = time.monotonic()
    self._restored_from = snap
    info = {
      "task": self.task.name,
      "format": self.task.format,
      "domain": self.task.domain,
      "difficulty": self.task.difficulty,
      "image": image,
      "adaptations": list(adaptations),
      "tools": self.tools,
      "max_turns": self.max_turns,
      "wall_clock_s": self.wall_clock_s,
      "durations": {
        "build_s": round(t_build, 3),
        "create_s": round(time.monotonic() - t0 - t_build, 3),
      },
    }
    return self.task.instruction, info

  @property
  def max_turns(self) -> int:
    return (
      self._max_turns if self._max_turns is not None else (self.task.max_turns if self.task else 50)
    )

  @property
  def wall_clock_s(self) -> float:
    return (
      self._wall_clock_s
      if self._wall_clock_s is not None
      else (self.task.agent_timeout_s if self.task else 600.0)
    )

  async def _astep(self, action):
    if self._sb is None or self._done:
      from ale.envs.core import EpisodeError

      raise EpisodeError(
        "step() called before reset() or after the episode ended; call reset() first"
      )
    self._turn += 1
    t0 = time.monotonic()
    outcomes = await arun_action(action, self._tools)
    self._tool_s += time.monotonic() - t0
    for o in outcomes:
      if o.call is not None and o.kind != "invalid":
        self._counts[o.call.name] = self._counts.get(o.call.name, 0) + 1
      if o.kind != "ok":
        self._errors.append(o.text)
    invalid = any(o.kind == "invalid" for o in outcomes)
    elapsed = time.monotonic() - self._t_start
    terminated = self._submitted
    truncated = not terminated and (self._turn >= self.max_turns or elapsed >= self.wall_clock_s)
    obs = render_outcomes(outcomes)
    info: dict[str, Any] = {
      "turn": self._turn,
      "invalid_action": invalid,
      "outcomes": [o.to_info() for o in outcomes],
      "errors": [o.text for o in outcomes if o.kind != "ok"],
      "tool_counts": dict(self._counts),
      "durations": {
        "step_s": round(time.monotonic() - t0, 3),
        "tools_s": round(self._tool_s, 3),
        "episode_s": round(elapsed, 3),
      },
    }
    reward = 0.0
    if terminated or truncated:
      self._done = True
      if truncated:
        why = "turn limit" if self._turn >= self.max_turns else "wall-clock limit"
        info["truncated_by"] = why
        obs += f"\n[episode ended: {why} reached]"
      if terminated or self.test_on_truncate:
        report = await run_tests(self._sb, self.task)
        reward = report.reward
        info["tests"] = report.to_info()
        info["durations"]["tests_s"] = round(report.duration_s, 3)
      info["success"] = bool(reward >= 1.0)
      info["all_errors"] = list(self._errors)
      await self._drop_sandbox()
    return obs, float(reward), terminated, truncated, info

  # ---- prefix snapshots (M6) --------------------------------------------------------
  async def _prefix_snapshot_reset(self, seed, options):
    from ale.envs.core import GemEnv

    prefix = list(options.get("prefix") or [])
    task = self._pick(options) if options.get("task") is not None else None
    key = hashlib.sha256(repr((task.name if task else None, seed, prefix)).encode()).hexdigest()[
      :16
    ]
    if key in self._snapshots:
      opts = {k: v for k, v in options.items() if k != "prefix"}
      obs, info = await GemEnv.areset(self, seed=seed, options={**opts, "_prefix_key": key})
      self._turn = len(prefix)
      info.update(
        prefix_len=len(prefix), restored_snapshot=self._snapshots[key], prefix_observations=None
      )
      obs = self._snapshot_obs[key]
      return obs, info
    obs, info = await GemEnv.areset(self, seed=seed, options=options)
    if prefix:
      tag = await self._sb.commit()
      self._snapshots[key] = tag
      self._snapshot_obs[key] = obs
      info["snapshot"] = tag
    return obs, info

  async def areset(self, *, seed=None, options=None):
    from ale.envs.core import ENV_LOOP

    if self.snapshot_prefixes and options and options.get("prefix"):
      return await ENV_LOOP.arun(self._prefix_snapshot_reset(seed, dict(options)))
    return await super().areset(seed=seed, options=options)

  def reset(self, *, seed=None, options=None):
    from ale.envs.core import ENV_LOOP

    if self.snapshot_prefixes and options and options.get("prefix"):
      return ENV_LOOP.run(self._prefix_snapshot_reset(seed, dict(options)))
    return super().reset(seed=seed, options=options)
