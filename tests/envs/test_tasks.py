"""Task instance loading (three formats) and Dockerfile adaptation; no Docker needed."""

import os
from pathlib import Path

import pytest

from ale.envs.tasks import (
  BASE_IMAGE,
  TaskError,
  adapt_dockerfile,
  builtin_tasks,
  detect_format,
  load_task,
  load_tasks,
  parse_pytest,
  staged_context,
)

# The unmodified upstream samples live beside the repository (../shared/tasks).
SHARED = Path(
  os.environ.get("ALE_SAMPLE_TASKS", Path(__file__).resolve().parents[3] / "shared" / "tasks")
)
needs_shared = pytest.mark.skipif(
  not SHARED.is_dir() and not os.environ.get("CI"), reason=f"sample tasks not at {SHARED}"
)


def test_builtin_suite_shape():
  tasks = builtin_tasks()
  assert len(tasks) >= 12
  assert len({t.domain for t in tasks}) >= 4
  for t in tasks:
    assert t.format == "ale" and t.solution is not None and t.solution.kind == "script"
    assert t.dockerfile.read_text().startswith(f"FROM {BASE_IMAGE}")
    assert ("/tests/run-tests.sh", t.path / "tests" / "run-tests.sh") in t.test_files
    assert adapt_dockerfile(t.dockerfile.read_text())[1] == []  # nothing to adapt in our own format
    assert "apt-get" not in t.dockerfile.read_text() and "pip" not in t.dockerfile.read_text()


@needs_shared
def test_shared_samples_load_unmodified():
  tasks = {t.name: t for t in load_tasks([SHARED / "terminal-bench-core", SHARED / "harbor"])}
  assert set(tasks) == {
    "fix-permissions",
    "grid-pattern-transform",
    "hello-world",
    "organization-json-generator",
    "sqlite-db-truncate",
    "simple-task",
  }
  fp = tasks["fix-permissions"]
  assert fp.format == "terminal-bench" and fp.verdict == "pytest" and fp.workdir == "/app"
  assert (
    fp.solution.kind == "keystrokes"
    and fp.solution.steps[1]["command"] == "chmod +x process_data.sh"
  )
  remote = dict(fp.test_files)
  assert (
    remote["/tests/run-tests.sh"] == SHARED / "terminal-bench-core" / "_defaults" / "run-tests.sh"
  )
  assert remote["/tests/setup-uv-pytest.sh"].name == "setup-uv-pytest.sh"
  grid = tasks["grid-pattern-transform"]
  assert dict(grid.test_files)["/tests/run-tests.sh"] == grid.path / "run-tests.sh"
  h = tasks["simple-task"]
  assert h.format == "harbor" and h.verdict == "reward_file" and h.workdir == "/app"
  assert (
    h.instruction.startswith("Create a file called hello.txt")
    and h.test_command == "bash /tests/test.sh"
  )
  assert h.memory_mb == 2048 and h.test_timeout_s == 120.0


@needs_shared
def test_staged_context_excludes_tests_and_solutions():
  t = load_task(SHARED / "terminal-bench-core" / "organization-json-generator")
  d, adaptations = staged_context(t)
  try:
    names = {p.name for p in d.iterdir()}
    assert names == {
      "Dockerfile",
      "departments.csv",
      "employees.csv",
      "projects.csv",
      "schema.json",
    }
    assert any("pip install jsonschema" in a for a in adaptations)
  finally:
    import shutil

    shutil.rmtree(d)


def test_adapt_dockerfile_rebases_and_bridges():
  text = """# comment
FROM ghcr.io/laude-institute/t-bench/python-3-13:latest AS base
RUN apt-get update && apt-get install -y --no-install-recommends git jq \\
    && pip install --no-cache-dir numpy==1.26 pyyaml
COPY x /app/x
RUN ["echo", "exec form kept"]
"""
  out, notes = adapt_dockerfile(text)
  lines = out.splitlines()
  assert lines[0] == f"FROM {BASE_IMAGE} AS base" and lines[1] == "WORKDIR /app"
  assert "apt-get update" not in out and "dpkg -s git" in out and "dpkg -s jq" in out
  assert "import numpy" in out and "import yaml" in out and "pip install" not in out
  assert 'RUN ["echo", "exec form kept"]' in out
  assert len(notes) == 5 and notes[0].startswith(
    "FROM ghcr.io/laude-institute/t-bench/python-3-13:latest ->"
  )
  out2, notes2 = adapt_dockerfile("FROM ubuntu:24.04\nWORKDIR /app\n")
  assert out2.splitlines()[:2] == [f"FROM {BASE_IMAGE}", "WORKDIR /"] and len(notes2) == 1
  same, none = adapt_dockerfile(f"FROM {BASE_IMAGE}\nRUN echo hi\n")
  assert none == [] and same == f"FROM {BASE_IMAGE}\nRUN echo hi\n"
  kept, _ = adapt_dockerfile("FROM mylocal:1\n", image_exists=lambda img: img == "mylocal:1")
  assert kept == "FROM mylocal:1\n"


def test_parse_pytest_summary():
  out = """
collected 3 items
=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_a
FAILED ../tests/test_outputs.py::test_b - AssertionError: x
ERROR ../tests/test_outputs.py
"""
  assert parse_pytest(out) == {
    "../tests/test_outputs.py::test_a": "PASSED",
    "../tests/test_outputs.py::test_b": "FAILED",
    "../tests/test_outputs.py": "ERROR",
  }
  assert parse_pytest("no tests ran") == {}


def test_bad_task_dirs_name_the_problem(tmp_path):
  with pytest.raises(TaskError, match="not a task directory"):
    detect_format(tmp_path)
  (tmp_path / "task.toml").write_text("[task]\nname = 'x'\n")
  with pytest.raises(TaskError, match="no \\[task\\] instruction"):
    load_task(tmp_path)
  (tmp_path / "task.toml").write_text("[task\n")
  with pytest.raises(TaskError, match="not valid TOML"):
    load_task(tmp_path)
  (tmp_path / "task.toml").unlink()
  (tmp_path / "task.yaml").write_text("descriptions: []\n")
  with pytest.raises(TaskError, match="no base description"):
    load_task(tmp_path)


def test_cli_reports_unloadable_dir(tmp_path, capsys):
  from ale.envs.cli import main

  assert main(["validate", str(tmp_path)]) == 2
  assert "not a task directory" in capsys.readouterr().err
