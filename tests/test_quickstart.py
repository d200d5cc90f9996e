"""The README's main job runs end to end and writes what it promises."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_runs_and_writes_metrics_and_plot(tmp_path, docker_client, base_image):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.quickstart",
      f"--out_dir={tmp_path}",
      "--steps=3",
      "--difficulty=easy",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for stage in ("[env", "[chat", "[model", "[ipa", "[sandbox"):
    assert stage in proc.stdout, proc.stdout
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  stages = {r["stage"]: r for r in records}
  assert stages["env"]["success"] is True
  assert stages["sandbox"]["exit_code"] == 0 and stages["sandbox"]["stdout"].split()[:3] == [
    "42",
    "1000",
    "lo",
  ]
  steps = [r for r in records if r["stage"] == "ipa_step"]
  assert len(steps) == 3 and steps[-1]["expert_logp"] > steps[0]["expert_logp"]
  assert (tmp_path / "summary.png").stat().st_size > 10_000
