"""BUILD must name every module and test file of the tree (and nothing that is gone)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _listed() -> set[str]:
  text = (ROOT / "BUILD").read_text()
  return set(re.findall(r'"([\w./-]+\.py)"', text))


def _tree() -> set[str]:
  files = set()
  for folder in ("ale", "tests", "benchmarks", "experiments"):
    for p in (ROOT / folder).rglob("*.py"):
      if "__pycache__" in p.parts or "builtin_tasks" in p.parts:
        continue
      files.add(p.relative_to(ROOT).as_posix())
  return files


def test_every_module_and_test_is_in_build():
  missing = sorted(_tree() - _listed())
  assert not missing, f"BUILD does not list {missing}; run `python3 scripts/gen_build.py`"


def test_build_lists_no_missing_file():
  gone = sorted(p for p in _listed() if not (ROOT / p).exists())
  assert not gone, (
    f"BUILD lists files that do not exist: {gone}; run `python3 scripts/gen_build.py`"
  )


def test_every_test_file_has_a_py_test_target():
  text = (ROOT / "BUILD").read_text()
  for p in sorted((ROOT / "tests").rglob("test_*.py")):
    rel = p.relative_to(ROOT).as_posix()
    assert re.search(r'py_test\(\s*name = "[^"]+",\s*srcs = \[\s*"' + re.escape(rel), text), (
      f"no py_test for {rel}"
    )
