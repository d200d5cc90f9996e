"""Append-only JSONL audit log (the paper's trustworthiness dimension, PAPER.md "ROCK").

Every create, exec (command, exit code, duration, bytes), file transfer, commit, egress
connection and delete becomes one JSON line with a wall-clock timestamp. Lines are
flushed as they are written, so a crash loses nothing already acknowledged.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class AuditLog:
  """Appends JSON records to `path` (None keeps them in memory only, for tests)."""

  def __init__(self, path: str | os.PathLike | None = None, *, keep: int = 10000):
    self.path = os.fspath(path) if path is not None else None
    self._lock = threading.Lock()
    self._recent: list[dict[str, Any]] = []
    self._keep = keep
    self._f = None
    if self.path:
      os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
      self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

  def record(self, event: str, **fields: Any) -> dict[str, Any]:
    rec = {"ts": round(time.time(), 6), "event": event, **fields}
    line = json.dumps(rec, default=str)
    with self._lock:
      self._recent.append(rec)
      if len(self._recent) > self._keep:
        del self._recent[: len(self._recent) - self._keep]
      if self._f:
        self._f.write(line + "\n")
        self._f.flush()
    return rec

  def recent(self, n: int | None = None, **match: Any) -> list[dict[str, Any]]:
    with self._lock:
      recs = [r for r in self._recent if all(r.get(k) == v for k, v in match.items())]
    return recs if n is None else recs[-n:]

  def close(self) -> None:
    with self._lock:
      if self._f:
        self._f.close()
        self._f = None


def read_audit(path: str | os.PathLike) -> list[dict[str, Any]]:
  """All records of an audit file, in order."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
