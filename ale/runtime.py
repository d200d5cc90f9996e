"""Process-level settings for running JAX on CPU hosts: the memory allocator.

XLA:CPU allocates each call's temporaries (activations, gradients, dispatch buffers) on
every step. With glibc's malloc, blocks that large are mapped from and returned to the
operating system each time, so every step page-faults its working set back in; with
tcmalloc they stay cached in the process. On the `small` preset (fwd+bwd, 1024 tokens,
2 cores) that is ~220 ms a step with glibc and ~170 ms with tcmalloc, and the small
elementwise ops gain the most. (PyTorch is the other way round here: slower with
tcmalloc, so `benchmarks/model.py` runs each framework with each allocator.)

An allocator has to be loaded before the process starts, through `LD_PRELOAD`, so the
launchers re-execute themselves once:

    from ale import runtime
    runtime.reexec_with_tcmalloc()   # first thing in main(); no-op when already loaded

`scripts/setup.sh` installs Debian's `libtcmalloc-minimal4`. Set `ALE_NO_TCMALLOC=1` to
keep the default allocator.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

__all__ = ["reexec_with_tcmalloc", "tcmalloc_path", "uses_tcmalloc"]

_CANDIDATES = (
  "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
  "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
  "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
  "/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4",
  "/usr/lib64/libtcmalloc_minimal.so.4",
  "/usr/local/lib/libtcmalloc_minimal.so.4",
)


def tcmalloc_path() -> str | None:
  """The path (or soname) of an installed tcmalloc shared library, or None."""
  for path in _CANDIDATES:
    if os.path.exists(path):
      return path
  for name in ("tcmalloc_minimal", "tcmalloc"):
    found = ctypes.util.find_library(name)  # a soname, which LD_PRELOAD resolves itself
    if found:
      return found
  return None


def uses_tcmalloc() -> bool:
  """Whether tcmalloc is loaded in this process."""
  try:
    with open("/proc/self/maps") as f:
      return "libtcmalloc" in f.read()
  except OSError:
    return "tcmalloc" in os.environ.get("LD_PRELOAD", "")


def reexec_with_tcmalloc(argv: list[str] | None = None) -> bool:
  """Re-executes this process with tcmalloc preloaded, once; returns False (and carries
  on) when it is already loaded, not installed, not on Linux, or `ALE_NO_TCMALLOC` is
  set. `argv` is a whole command line, interpreter first; it defaults to the original
  one (`sys.orig_argv`), so `python -m pkg.mod --flags` comes back the same way. Call
  it before starting threads."""
  if os.environ.get("ALE_NO_TCMALLOC") or not sys.platform.startswith("linux"):
    return False
  if uses_tcmalloc() or os.environ.get("_ALE_TCMALLOC_REEXEC"):
    return False  # loaded, or a re-exec already tried and it did not load
  path = tcmalloc_path()
  if path is None:
    return False
  env = dict(os.environ, _ALE_TCMALLOC_REEXEC="1")
  env["LD_PRELOAD"] = ":".join(p for p in (path, os.environ.get("LD_PRELOAD", "")) if p)
  args = list(argv) if argv is not None else list(sys.orig_argv)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *args[1:]], env)
  return True  # not reached
