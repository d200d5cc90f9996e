"""The tcmalloc re-exec of ale.runtime, in real subprocesses."""

import os
import subprocess
import sys

import pytest

from ale import runtime

PROBE = "from ale import runtime; runtime.reexec_with_tcmalloc(); print(runtime.uses_tcmalloc())"


def _run(**env):
  full = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "_ALE_TCMALLOC_REEXEC")}
  full.update(env)
  out = subprocess.run(
    [sys.executable, "-c", PROBE], capture_output=True, text=True, env=full, timeout=60
  )
  assert out.returncode == 0, out.stderr
  return out.stdout.strip()


def test_tcmalloc_is_installed_in_ci():
  if runtime.tcmalloc_path() is None:
    if os.environ.get("CI"):
      pytest.fail("scripts/setup.sh should have installed libtcmalloc-minimal4")
    pytest.skip("libtcmalloc-minimal4 is not installed (scripts/setup.sh installs it)")
  assert os.path.exists(runtime.tcmalloc_path())


def test_reexec_loads_tcmalloc_once_and_can_be_turned_off():
  if runtime.tcmalloc_path() is None:
    pytest.skip("libtcmalloc-minimal4 is not installed")
  assert _run() == "True"
  assert _run(ALE_NO_TCMALLOC="1") == "False"
  # A re-exec that already happened is not repeated (no loop when preloading fails).
  assert _run(_ALE_TCMALLOC_REEXEC="1") == "False"
