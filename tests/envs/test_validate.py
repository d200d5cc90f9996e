"""`ale-task validate` on the built-in suite and the unmodified upstream samples (Docker)."""

import json
import os
from pathlib import Path

import pytest

from ale.envs.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SHARED = Path(
  os.environ.get("ALE_SAMPLE_TASKS", Path(__file__).resolve().parents[3] / "shared" / "tasks")
)


def _lines(out):
  return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_builtin_suite_validates(base_image, capsys):
  code = main(["validate", "builtin", "--concurrency", "4"])
  out = capsys.readouterr().out
  results = _lines(out)
  assert len(results) >= 12, out
  bad = [r for r in results if not r["valid"]]
  assert not bad and code == 0, out
  for r in results:
    assert r["oracle_pass"] is True and r["null_pass"] is False and r["adaptations"] == []
    assert {"task", "valid", "oracle_pass", "null_pass", "seconds", "adaptations"} <= set(r)
  assert f"{len(results)}/{len(results)} tasks valid" in out


@pytest.mark.skipif(
  not SHARED.is_dir() and not os.environ.get("CI"), reason=f"sample tasks not at {SHARED}"
)
def test_shared_samples_validate_unmodified(base_image, capsys):
  code = main(["validate", str(SHARED / "terminal-bench-core"), str(SHARED / "harbor")])
  out = capsys.readouterr().out
  results = {r["task"]: r for r in _lines(out)}
  assert len(results) == 6, out
  # every sample needed its unpullable base image rebased; the report says so
  for r in results.values():
    assert any("-> ale/base:latest" in a for a in r["adaptations"]), r
  bad = {k: r.get("error") or r for k, r in results.items() if not r["valid"]}
  assert not bad and code == 0, json.dumps(bad, indent=1)
