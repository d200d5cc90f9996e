"""Task instances: instruction + container + tests + reference solution (paper: instances).

One directory per task, in one of three formats (detected from the files):

ale (ours)::

    task.toml              [task] name, instruction, domain, difficulty, tags
                           [environment] workdir, user, cpus, memory_mb, pids
                           [timeouts] agent_s, test_s, build_s   [agent] max_turns
    environment/Dockerfile FROM ale/base:latest (+ build context)
    tests/run-tests.sh     run as root with TEST_DIR=/tests; exit 0 = pass (or it
                           writes /logs/verifier/reward.txt)
    solution/solve.sh      the reference solution

Terminal-Bench (task.yaml, Dockerfile, solution.sh or solution.yaml keystrokes, tests/,
optional run-tests.sh; the dataset's `_defaults/` and `_scripts/` beside the tasks):
passes when pytest reports at least one test and every test passed.

harbor (task.toml, instruction.md, environment/Dockerfile, tests/test.sh,
solution/solve.sh): the tests write /logs/verifier/reward.txt or reward.json; the exit
code is ignored.

Tests and solutions are copied into a container only after the agent's episode (tests)
or by the oracle (solutions): the agent never sees them. Dockerfiles are adapted for a
machine without registry or network access (`adapt_dockerfile`), and every adaptation is
reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import tarfile
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

from ale.envs.bridge import BRIDGE_BIN, PIP_TO_MODULE, bridge_script

BASE_IMAGE = "ale/base:latest"
BUILTIN_DIR = Path(__file__).parent / "builtin_tasks"

# The Terminal-Bench dataset's default test runner and helper scripts (Apache-2.0),
# used when a task directory has no `_defaults/`/`_scripts/` beside it.
_TB_DEFAULT_RUN_TESTS = (
  "#!/bin/bash\n\nsource $TEST_DIR/setup-uv-pytest.sh\nbash $TEST_DIR/run-uv-pytest.sh\n"
)
_TB_SCRIPTS = {
  "setup-uv-pytest.sh": (
    "#!/bin/bash\n\napt-get update\napt-get install -y curl\n\ncurl -LsSf https://astral.sh/uv/install.sh | sh\n\n"
    'source $HOME/.local/bin/env\n\nif [ "$PWD" = "/" ]; then\n    echo "Error: No working directory set."\n'
    "    exit 1\nfi\n\nuv init\nuv add pytest\n"
  ),
  "run-uv-pytest.sh": "#! /bin/bash\n\nuv run pytest $TEST_DIR/test_outputs.py -rA\n",
}


class TaskError(ValueError):
  """A task directory is malformed; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class Solution:
  """A reference solution: a shell script, or tmux keystrokes (Terminal-Bench yaml)."""

  kind: str  # "script" | "keystrokes"
  path: Path
  steps: tuple[dict[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class Task:
  """One task instance, format-independent.

  `test_files` maps a path inside the container to a host file copied in before the
  tests run; `test_command` runs them (cwd `workdir`, env `TEST_DIR=/tests`); `verdict`
  is "exit_code", "pytest" (>= 1 test, all passed) or "reward_file".
  """

  name: str
  path: Path
  format: str
  instruction: str
  domain: str = "misc"
  difficulty: str = "medium"
  tags: tuple[str, ...] = ()
  workdir: str = "/workspace"
  user: str = "root"
  cpus: float = 1.0
  memory_mb: int = 1024
  pids: int = 512
  agent_timeout_s: float = 600.0
  test_timeout_s: float = 120.0
  build_timeout_s: float = 600.0
  max_turns: int = 50
  context_dir: Path = Path(".")
  dockerfile: Path = Path("Dockerfile")
  test_files: tuple[tuple[str, Path], ...] = ()
  test_command: str = "bash /tests/run-tests.sh"
  verdict: str = "exit_code"
  solution: Solution | None = None

  def __post_init__(self):
    if self.verdict not in ("exit_code", "pytest", "reward_file"):
      raise TaskError(f"task {self.name}: unknown verdict {self.verdict!r}")


# ---- loading --------------------------------------------------------------------------
def detect_format(path: Path) -> str:
  path = Path(path)
  if (path / "task.yaml").is_file():
    return "terminal-bench"
  if (path / "task.toml").is_file():
    if (path / "instruction.md").is_file() and (path / "tests" / "test.sh").is_file():
      return "harbor"
    return "ale"
  raise TaskError(
    f"{path} is not a task directory: expected task.toml (ale or harbor format) or task.yaml (Terminal-Bench)"
  )


def load_task(path: str | os.PathLike) -> Task:
  """Loads one task directory in any of the three formats."""
  path = Path(path).resolve()
  if not path.is_dir():
    raise TaskError(f"task path {path} is not a directory")
  fmt = detect_format(path)
  return {"ale": _load_ale, "terminal-bench": _load_tb, "harbor": _load_harbor}[fmt](path)


def load_tasks(paths) -> list[Task]:
  """Loads task directories; a directory holding task directories is expanded."""
  out = []
  for p in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
    p = Path(p)
    try:
      detect_format(p)
      out.append(load_task(p))
    except TaskError:
      subs = (
        sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
        if p.is_dir()
        else []
      )
      found = [
        load_task(d) for d in subs if (d / "task.toml").is_file() or (d / "task.yaml").is_file()
      ]
      if not found:
        raise
      out += found
  return out


def builtin_tasks() -> list[Task]:
  """The built-in Docker terminal task suite (package data)."""
  return load_tasks(BUILTIN_DIR)


def _read_toml(path: Path) -> dict[str, Any]:
  try:
    return tomllib.loads(path.read_text())
  except tomllib.TOMLDecodeError as e:
    raise TaskError(f"{path} is not valid TOML: {e}") from e


def _test_files(tests_dir: Path) -> tuple[tuple[str, Path], ...]:
  if not tests_dir.is_dir():
    return ()
  return tuple(
    (f"/tests/{p.relative_to(tests_dir).as_posix()}", p)
    for p in sorted(tests_dir.rglob("*"))
    if p.is_file()
  )


def _load_ale(path: Path) -> Task:
  cfg = _read_toml(path / "task.toml")
  t, env, to, ag = (
    cfg.get("task", {}),
    cfg.get("environment", {}),
    cfg.get("timeouts", {}),
    cfg.get("agent", {}),
  )
  if not t.get("instruction"):
    raise TaskError(f'{path}/task.toml has no [task] instruction; add instruction = "..."')
  if not (path / "environment" / "Dockerfile").is_file():
    raise TaskError(f"{path} has no environment/Dockerfile (FROM {BASE_IMAGE})")
  if not (path / "tests" / "run-tests.sh").is_file():
    raise TaskError(f"{path} has no tests/run-tests.sh")
  sol = path / "solution" / "solve.sh"
  return Task(
    name=t.get("name", path.name),
    path=path,
    format="ale",
    instruction=t["instruction"].strip(),
    domain=t.get("domain", "misc"),
    difficulty=t.get("difficulty", "medium"),
    tags=tuple(t.get("tags", ())),
    workdir=env.get("workdir", "/workspace"),
    user=env.get("user", "root"),
    cpus=float(env.get("cpus", 1.0)),
    memory_mb=int(env.get("memory_mb", 1024)),
    pids=int(env.get("pids", 512)),
    agent_timeout_s=float(to.get("agent_s", 600)),
    test_timeout_s=float(to.get("test_s", 120)),
    build_timeout_s=float(to.get("build_s", 600)),
    max_turns=int(ag.get("max_turns", 50)),
    context_dir=path / "environment",
    dockerfile=path / "environment" / "Dockerfile",
    test_files=_test_files(path / "tests"),
    test_command="bash /tests/run-tests.sh",
    verdict="exit_code",
    solution=Solution("script", sol) if sol.is_file() else None,
  )


def _load_tb(path: Path) -> Task:
  try:
    cfg = yaml.safe_load((path / "task.yaml").read_text()) or {}
  except yaml.YAMLError as e:
    raise TaskError(f"{path}/task.yaml is not valid YAML: {e}") from e
  descs = cfg.get("descriptions") or []
  instruction = cfg.get("instruction") or next(
    (d.get("description") for d in descs if d.get("key") == "base"), None
  )
  if not instruction:
    raise TaskError(f"{path}/task.yaml has no base description (descriptions: - key: base)")
  if not (path / "Dockerfile").is_file():
    raise TaskError(f"{path} has no Dockerfile")
  files = list(_test_files(path / "tests"))
  scripts_dir, defaults_dir = path.parent / "_scripts", path.parent / "_defaults"
  for name in cfg.get("test_scripts") or []:
    src = scripts_dir / name
    files.append((f"/tests/{name}", src if src.is_file() else _builtin_script(name)))
  run_tests = path / "run-tests.sh"
  if not run_tests.is_file():
    run_tests = (
      defaults_dir / "run-tests.sh"
      if (defaults_dir / "run-tests.sh").is_file()
      else _builtin_script("run-tests.sh")
    )
  files.append(("/tests/run-tests.sh", run_tests))
  if (path / "solution.sh").is_file():
    solution = Solution("script", path / "solution.sh")
  elif (path / "solution.yaml").is_file():
    steps = yaml.safe_load((path / "solution.yaml").read_text()) or []
    if not isinstance(steps, list) or not all(
      isinstance(s, dict) and "command" in s for s in steps
    ):
      raise TaskError(
        f"{path}/solution.yaml must be a list of {{command, min_timeout_sec, block, append_enter}}"
      )
    solution = Solution("keystrokes", path / "solution.yaml", tuple(steps))
  else:
    solution = None
  if cfg.get("parser_name", "pytest") != "pytest":
    raise TaskError(
      f"{path}/task.yaml: parser_name {cfg.get('parser_name')!r} is not supported (only pytest)"
    )
  return Task(
    name=path.name,
    path=path,
    format="terminal-bench",
    instruction=instruction.strip(),
    domain=cfg.get("category", "misc"),
    difficulty=cfg.get("difficulty", "medium"),
    tags=tuple(cfg.get("tags") or ()),
    workdir="/app",
    user="root",
    agent_timeout_s=float(cfg.get("max_agent_timeout_sec", 360)),
    test_timeout_s=float(cfg.get("max_test_timeout_sec", 60)),
    context_dir=path,
    dockerfile=path / "Dockerfile",
    test_files=tuple(files),
    test_command="bash /tests/run-tests.sh",
    verdict="pytest",
    solution=solution,
  )


def _builtin_script(name: str) -> Path:
  """Materialises one of the Terminal-Bench default scripts into a cache file."""
  text = _TB_DEFAULT_RUN_TESTS if name == "run-tests.sh" else _TB_SCRIPTS.get(name)
  if text is None:
    raise TaskError(
      f"test script {name!r} is not beside the task (_scripts/) and has no built-in default"
    )
  d = Path(tempfile.gettempdir()) / "ale-tb-scripts"
  d.mkdir(exist_ok=True)
  p = d / name
  if not p.exists() or p.read_text() != text:
    p.write_text(text)
  return p


def _load_harbor(path: Path) -> Task:
  cfg = _read_toml(path / "task.toml")
  env, ver, ag = cfg.get("environment", {}), cfg.get("verifier", {}), cfg.get("agent", {})
  meta = cfg.get("metadata", {})
  if not (path / "environment" / "Dockerfile").is_file():
    raise TaskError(f"{path} has no environment/Dockerfile")
  sol = path / "solution" / "solve.sh"
  return Task(
    name=path.name,
    path=path,
    format="harbor",
    instruction=(path / "instruction.md").read_text().strip(),
    domain=meta.get("category", "misc"),
    difficulty=meta.get("difficulty", "medium"),
    tags=tuple(meta.get("tags", ())),
    workdir=_last_workdir((path / "environment" / "Dockerfile").read_text()) or "/",
    user="root",
    cpus=float(env.get("cpus", 1)),
    memory_mb=int(env.get("memory_mb", 1024)),
    agent_timeout_s=float(ag.get("timeout_sec", 600)),
    test_timeout_s=float(ver.get("timeout_sec", 120)),
    build_timeout_s=float(env.get("build_timeout_sec", 600)),
    context_dir=path / "environment",
    dockerfile=path / "environment" / "Dockerfile",
    test_files=_test_files(path / "tests"),
    test_command="bash /tests/test.sh",
    verdict="reward_file",
    solution=Solution("script", sol) if sol.is_file() else None,
  )


# ---- Dockerfile adaptation --------------------------------------------------------------
def _logical_lines(text: str) -> list[str]:
  """Joins backslash continuations; drops comments and blank lines."""
  out, cur = [], ""
  for raw in text.splitlines():
    line = raw.rstrip()
    if not cur and (not line.strip() or line.lstrip().startswith("#")):
      continue
    if cur and line.lstrip().startswith("#"):
      continue
    if line.endswith("\\"):
      cur += line[:-1] + " "
      continue
    cur += line
    out.append(cur.strip())
    cur = ""
  if cur.strip():
    out.append(cur.strip())
  return out


def _last_workdir(text: str) -> str | None:
  wd = None
  for line in _logical_lines(text):
    if line.split(None, 1)[0].upper() == "WORKDIR":
      arg = line.split(None, 1)[1].strip()
      wd = arg if arg.startswith("/") else posix_join(wd or "/", arg)
  return wd


def posix_join(a: str, b: str) -> str:
  import posixpath

  return posixpath.normpath(posixpath.join(a, b))


_PIP = re.compile(r"^(?:sudo\s+)?(?:python3?\s+-m\s+)?pip3?\s+install\s+(.*)$")
_APT_INSTALL = re.compile(r"^(?:sudo\s+)?apt(?:-get)?\s+(?:-\S+\s+)*install\s+(.*)$")
_APT_UPDATE = re.compile(r"^(?:sudo\s+)?apt(?:-get)?\s+(?:-\S+\s+)*update\b.*$")


def _adapt_run(cmd: str, adaptations: list[str]) -> str:
  """Rewrites network installs in one RUN command (split on && and ;)."""
  parts = re.split(r"\s*(&&|;)\s*", cmd)
  out = []
  for i in range(0, len(parts), 2):
    seg = parts[i].strip()
    sep = parts[i + 1] if i + 1 < len(parts) else None
    new = seg
    if _APT_UPDATE.match(seg):
      new = "true"
      adaptations.append("dropped `apt-get update` (no network in builds)")
    elif m := _APT_INSTALL.match(seg):
      pkgs = [p.split("=")[0] for p in shlex.split(m.group(1)) if not p.startswith("-")]
      checks = " && ".join(
        f"{{ dpkg -s {shlex.quote(p)} >/dev/null 2>&1 || {{ echo 'ale: Debian package {p} is not in {BASE_IMAGE} and cannot be installed offline; add it to the base image' >&2; exit 1; }}; }}"
        for p in pkgs
      )
      new = checks or "true"
      adaptations.append(
        f"apt-get install {' '.join(pkgs)} -> packages of {BASE_IMAGE} (checked at build)"
      )
    elif m := _PIP.match(seg):
      pkgs = [p for p in shlex.split(m.group(1)) if not p.startswith("-")]
      checks = []
      for p in pkgs:
        dist = re.split(r"[<>=!~\[;@ ]", p, maxsplit=1)[0].lower()
        mod = PIP_TO_MODULE.get(dist, dist.replace("-", "_"))
        checks.append(
          f"{{ python3 -c 'import {mod}' 2>/dev/null || {{ echo 'ale: pip package {dist} (module {mod}) is not in {BASE_IMAGE} and "
          f"cannot be installed offline; add the Debian package python3-{dist} to the base image' >&2; exit 1; }}; }}"
        )
        adaptations.append(
          f"pip install {dist} -> Debian python3-{dist} from {BASE_IMAGE} (checked at build)"
        )
      new = " && ".join(checks) or "true"
    out.append(new)
    if sep:
      out.append(sep)
  return " ".join(out)


def adapt_dockerfile(text: str, *, image_exists=None) -> tuple[str, list[str]]:
  """Rebases unpullable images onto the base image and bridges network installs.

  - `FROM img` where `img` is not a local image (`image_exists(img)` is False; no image
    can be pulled here) becomes `FROM ale/base:latest`; Terminal-Bench base images set
    `WORKDIR /app` and provide `python`, so those follow the FROM; other images get
    `WORKDIR /` (their default).
  - `apt-get update` is dropped; `apt-get install P` and `pip install P` become checks
    that P is already in the base image (Debian python3-* packages), failing the build
    with a message naming the package to add.

  Returns the new Dockerfile text and the list of adaptations (empty: unchanged).
  """
  exists = image_exists or (lambda img: img.startswith("ale/"))
  adaptations: list[str] = []
  out: list[str] = []
  for line in _logical_lines(text):
    word, _, rest = line.partition(" ")
    kw = word.upper()
    if kw == "FROM":
      toks = rest.split()
      img = next((t for t in toks if not t.startswith("--")), "")
      if img and not exists(img):
        alias = f" AS {toks[-1]}" if len(toks) >= 3 and toks[-2].upper() == "AS" else ""
        out.append(f"FROM {BASE_IMAGE}{alias}")
        if "t-bench" in img:
          out += [
            "WORKDIR /app",
            "RUN [ -e /usr/bin/python ] || ln -s /usr/bin/python3 /usr/local/bin/python",
          ]
          adaptations.append(
            f"FROM {img} -> {BASE_IMAGE} (+ WORKDIR /app, python -> python3, as the t-bench image)"
          )
        else:
          out.append("WORKDIR /")
          adaptations.append(f"FROM {img} -> {BASE_IMAGE} (+ WORKDIR /)")
        continue
    elif kw == "RUN" and not rest.lstrip().startswith("["):
      new = _adapt_run(rest, adaptations)
      out.append(f"RUN {new}")
      continue
    out.append(line)
  return "\n".join(out) + "\n", adaptations


def staged_context(task: Task, *, image_exists=None) -> tuple[Path, list[str]]:
  """Copies the task's build context (minus tests and solutions) with the adapted
  Dockerfile into a fresh temp dir. The caller removes it. Returns (dir, adaptations)."""
  text, adaptations = adapt_dockerfile(task.dockerfile.read_text(), image_exists=image_exists)
  tmp = Path(tempfile.mkdtemp(prefix=f"ale-build-{task.name}-"))
  skip = {
    "tests",
    "solution",
    "solution.sh",
    "solution.yaml",
    "run-tests.sh",
    "task.yaml",
    "task.toml",
    "Dockerfile",
    "instruction.md",
  }
  for p in sorted(task.context_dir.iterdir()):
    if p.name in skip or p.name.startswith("."):
      continue
    if p.is_dir():
      shutil.copytree(p, tmp / p.name, symlinks=True)
    else:
      shutil.copy2(p, tmp / p.name)
  (tmp / "Dockerfile").write_text(text)
  return tmp, adaptations


def context_digest(d: Path) -> str:
  """A content hash of a build context (paths, modes, bytes)."""
  h = hashlib.sha256()
  for p in sorted(d.rglob("*")):
    h.update(p.relative_to(d).as_posix().encode())
    if p.is_file():
      h.update(oct(p.stat().st_mode & 0o777).encode())
      h.update(p.read_bytes())
  return h.hexdigest()[:16]


# ---- running tests and solutions inside a sandbox ----------------------------------------
def tests_tar(task: Task) -> bytes:
  """The task's test files as a tar stream rooted at /tests (for upload)."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tar:
    for remote, local in task.test_files:
      info = tar.gettarinfo(str(local), arcname=remote.removeprefix("/tests/"))
      info.uid = info.gid = 0
      info.uname = info.gname = "root"
      info.mode = 0o755 if remote.endswith(".sh") else 0o644
      with open(local, "rb") as f:
        tar.addfile(info, f)
  return buf.getvalue()


_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)", re.M)


def parse_pytest(output: str) -> dict[str, str]:
  """Test id -> status from pytest `-rA` short summary lines."""
  results: dict[str, str] = {}
  idx = output.rfind("short test summary info")
  for status, test in _PYTEST_LINE.findall(output[idx:] if idx >= 0 else output):
    results[test] = status
  return results


@dataclasses.dataclass
class TestReport:
  passed: bool
  reward: float
  verdict: str
  output: str
  duration_s: float
  details: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_info(self) -> dict[str, Any]:
    return {
      "passed": self.passed,
      "reward": self.reward,
      "verdict": self.verdict,
      "output": self.output[-8000:],
      "duration_s": round(self.duration_s, 3),
      **self.details,
    }


def _exec_env(task: Task) -> dict[str, str]:
  return {
    "TEST_DIR": "/tests",
    "HOME": "/root",
    "PATH": f"{BRIDGE_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "DEBIAN_FRONTEND": "noninteractive",
  }


async def run_tests(sb, task: Task) -> TestReport:
  """Copies the tests (and the offline bridge) into `sb`, runs them, judges the result."""
  import time

  t0 = time.monotonic()
  setup = await sb.exec(
    bridge_script()
    + "\nrm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent",
    timeout_s=60,
    cwd="/",
  )
  if setup.exit_code != 0:
    return TestReport(
      False,
      0.0,
      task.verdict,
      f"test setup failed: {setup.stderr or setup.stdout}",
      time.monotonic() - t0,
    )
  await sb.write("/tmp/ale-tests.tar", tests_tar(task))
  up = await sb.exec(
    "tar -xf /tmp/ale-tests.tar -C /tests && rm -f /tmp/ale-tests.tar", timeout_s=60, cwd="/"
  )
  if up.exit_code != 0:
    return TestReport(
      False, 0.0, task.verdict, f"copying tests failed: {up.stderr}", time.monotonic() - t0
    )
  res = await sb.exec(
    task.test_command, timeout_s=task.test_timeout_s, cwd=task.workdir, env=_exec_env(task)
  )
  output = res.stdout + ("\n" + res.stderr if res.stderr else "")
  details: dict[str, Any] = {"exit_code": res.exit_code, "timed_out": res.timed_out}
  if task.verdict == "pytest":
    results = parse_pytest(res.stdout)
    details["tests"] = results
    passed = bool(results) and all(s == "PASSED" for s in results.values())
    reward = 1.0 if passed else 0.0
  elif task.verdict == "reward_file":
    reward = await read_reward(sb)
    details["reward_file"] = reward is not None
    reward = reward or 0.0
    passed = reward >= 1.0 - 1e-9
  else:
    reward_file = await read_reward(sb)
    if reward_file is not None:
      reward, passed = reward_file, reward_file >= 1.0 - 1e-9
    else:
      passed = res.exit_code == 0 and not res.timed_out
      reward = 1.0 if passed else 0.0
  return TestReport(passed, float(reward), task.verdict, output, time.monotonic() - t0, details)


async def read_reward(sb) -> float | None:
  """Reads /logs/verifier/reward.txt (a number) or reward.json ({"reward": x})."""
  res = await sb.exec(
    "if [ -f /logs/verifier/reward.txt ]; then echo TXT; cat /logs/verifier/reward.txt; "
    "elif [ -f /logs/verifier/reward.json ]; then echo JSON; cat /logs/verifier/reward.json; fi",
    timeout_s=30,
    cwd="/",
  )
  kind, _, body = res.stdout.partition("\n")
  try:
    if kind == "TXT":
      return float(body.strip().split()[0])
    if kind == "JSON":
      data = json.loads(body)
      if isinstance(data, (int, float)):
        return float(data)
      if isinstance(data, dict):
        if "reward" in data:
          return float(data["reward"])
        vals = [float(v) for v in data.values() if isinstance(v, (int, float))]
        return sum(vals) / len(vals) if vals else 0.0
  except (ValueError, IndexError):
    return 0.0
  return None


async def run_solution(sb, task: Task) -> dict[str, Any]:
  """Runs the reference solution in `sb` (script, or keystrokes replayed into tmux)."""
  import asyncio
  import time

  sol = task.solution
  if sol is None:
    raise TaskError(f"task {task.name} has no reference solution")
  t0 = time.monotonic()
  env = {"HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
  if sol.kind == "script":
    await sb.write("/oracle/solution.sh", sol.path.read_bytes(), mode=0o755)
    res = await sb.exec(
      "bash /oracle/solution.sh", timeout_s=task.agent_timeout_s, cwd=task.workdir, env=env
    )
    await sb.exec("rm -rf /oracle", timeout_s=30, cwd="/")
    return {
      "exit_code": res.exit_code,
      "output": (res.stdout + res.stderr)[-4000:],
      "seconds": time.monotonic() - t0,
    }
  # keystrokes: a tmux session in the workdir; block=True waits for the command to end
  q = shlex.quote
  start = await sb.exec(
    f"tmux new-session -d -s oracle -x 200 -y 50 -c {q(task.workdir)}",
    timeout_s=30,
    cwd=task.workdir,
    env=env,
  )
  if start.exit_code != 0:
    return {"exit_code": start.exit_code, "output": start.stderr, "seconds": time.monotonic() - t0}
  for step in sol.steps:
    cmd = str(step["command"])
    block = bool(step.get("block", False))
    keys = [q(cmd + ("; tmux wait-for -S ale-done" if block else ""))]
    if step.get("append_enter", True):
      keys.append("Enter")
    await sb.exec(f"tmux send-keys -t oracle {' '.join(keys)}", timeout_s=30, cwd=task.workdir)
    if block:
      await sb.exec(
        "tmux wait-for ale-done",
        timeout_s=float(step.get("max_timeout_sec", 180)),
        cwd=task.workdir,
      )
    await asyncio.sleep(float(step.get("min_timeout_sec", 0.0)))
  pane = await sb.exec(
    "tmux capture-pane -p -t oracle; tmux kill-session -t oracle", timeout_s=30, cwd=task.workdir
  )
  return {"exit_code": 0, "output": pane.stdout[-4000:], "seconds": time.monotonic() - t0}


__all__ = [
  "BASE_IMAGE",
  "BUILTIN_DIR",
  "Solution",
  "Task",
  "TaskError",
  "TestReport",
  "adapt_dockerfile",
  "builtin_tasks",
  "context_digest",
  "detect_format",
  "load_task",
  "load_tasks",
  "parse_pytest",
  "read_reward",
  "run_solution",
  "run_tests",
  "staged_context",
  "tests_tar",
]
