"""Request and result types of the sandbox service (ROCK's sandbox API, PAPER.md "ROCK").

`SandboxSpec` is the validated form of a create request; its defaults are the secure
ones (no network, non-root, read-only root filesystem, small limits). `ExecResult` is
what one command returns. `SandboxError` carries the HTTP status a service answers with,
so the embedded client and the REST client raise the same errors.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

BASE_IMAGE = "ale/base:latest"

# uid:gid of the `agent` user in the base image; used when a request names no user.
DEFAULT_USER = "1000:1000"

_HOSTPORT = re.compile(r"^\[?([A-Za-z0-9_.\-:]+?)\]?:(\d{1,5})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SandboxError(Exception):
  """An error with the HTTP status the service maps it to."""

  status = 500

  def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None):
    super().__init__(message)
    if status is not None:
      self.status = status
    self.retry_after = retry_after


class BadRequest(SandboxError):
  status = 400


class NotFound(SandboxError):
  status = 404


class Conflict(SandboxError):
  status = 409


class OverCapacity(SandboxError):
  status = 429


def error_from_status(status: int, message: str, retry_after: float | None = None) -> SandboxError:
  """The exception class for an HTTP status (used by the REST client)."""
  cls = {400: BadRequest, 404: NotFound, 409: Conflict, 429: OverCapacity}.get(status, SandboxError)
  return cls(message, status=status, retry_after=retry_after)


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
  """The outcome of one command run in a sandbox.

  `stdout`/`stderr` are capped at the service's output limit; `truncated` says a cap
  was hit. `timed_out` says the deadline passed and the command's process group (and
  anything it spawned) was killed.
  """

  exit_code: int
  stdout: str
  stderr: str
  timed_out: bool = False
  truncated: bool = False
  duration_s: float = 0.0

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> ExecResult:
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def parse_hostport(s: str) -> tuple[str, int]:
  """`"host:port"` -> (host, port); raises BadRequest naming the entry."""
  if not isinstance(s, str):
    raise BadRequest(f"allow entry {s!r} is not a string; expected 'host:port'")
  m = _HOSTPORT.match(s.strip())
  if not m or not (0 < int(m.group(2)) < 65536):
    raise BadRequest(f"allow entry {s!r} is not 'host:port' with a port in 1..65535")
  return m.group(1).lower(), int(m.group(2))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSpec:
  """A validated create request. Every field has the secure default.

  Attributes:
    image: image tag or id (must exist on the engine; nothing is pulled).
    cpus: CPU quota in cores (CFS quota), > 0.
    memory_mb: memory limit (no swap), >= 16.
    pids: maximum number of processes/threads, >= 8.
    disk_mb: size of each writable tmpfs (`/workspace`, `/tmp`) of a read-only sandbox.
    network: "none" (no interface but loopback) or "allowlist" (an internal network
      whose only exit is the per-sandbox egress proxy, the Rocklet; see egress.py).
    allow: "host:port" pairs the Rocklet forwards to (allowlist mode only).
    env: environment of every command.
    workdir: default working directory of commands.
    user: None runs as uid 1000 (`agent`); "root" must be asked for explicitly (still
      without capabilities or network).
    read_only: read-only root filesystem with size-limited writable /workspace and /tmp;
      `False` is an explicit override (task images that write anywhere).
    ttl_s: lifetime after which the service deletes the sandbox.
    labels: caller's labels (kept by the service, shown in listings).
    from_snapshot: an image tag made by `commit`; its /workspace is restored.
  """

  image: str = BASE_IMAGE
  cpus: float = 1.0
  memory_mb: int = 512
  pids: int = 256
  disk_mb: int = 256
  network: str = "none"
  allow: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()
  workdir: str = "/workspace"
  user: str | None = None
  read_only: bool = True
  ttl_s: float = 3600.0
  labels: tuple[tuple[str, str], ...] = ()
  from_snapshot: str | None = None

  @classmethod
  def from_request(cls, body: Any) -> SandboxSpec:
    """Validates a JSON body (dict); unknown keys and bad values raise BadRequest."""
    if not isinstance(body, dict):
      raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    known = {f.name for f in dataclasses.fields(cls)} | {"wait", "admission_timeout_s"}
    unknown = sorted(set(body) - known)
    if unknown:
      raise BadRequest(f"unknown field(s) {unknown}; known fields are {sorted(known)}")
    kw: dict[str, Any] = {}
    for name in ("image", "workdir", "network"):
      if name in body:
        if not isinstance(body[name], str) or not body[name]:
          raise BadRequest(f"{name} must be a non-empty string, got {body[name]!r}")
        kw[name] = body[name]
    for name in ("user", "from_snapshot"):
      if body.get(name) is not None:
        if not isinstance(body[name], str) or not body[name]:
          raise BadRequest(f"{name} must be a non-empty string or null, got {body[name]!r}")
        kw[name] = body[name]
    for name, lo, typ in (
      ("cpus", 0.01, float),
      ("memory_mb", 16, int),
      ("pids", 8, int),
      ("disk_mb", 1, int),
      ("ttl_s", 1.0, float),
    ):
      if name in body and body[name] is not None:
        v = body[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
          raise BadRequest(f"{name} must be a number, got {v!r}")
        if typ is int and int(v) != v:
          raise BadRequest(f"{name} must be an integer, got {v!r}")
        if v < lo:
          raise BadRequest(f"{name}={v!r} is below the minimum {lo}")
        kw[name] = typ(v)
    if "read_only" in body:
      if not isinstance(body["read_only"], bool):
        raise BadRequest(f"read_only must be true or false, got {body['read_only']!r}")
      kw["read_only"] = body["read_only"]
    for name in ("env", "labels"):
      v = body.get(name) or {}
      if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
      ):
        raise BadRequest(f"{name} must be an object of string to string, got {v!r}")
      if name == "env":
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
          raise BadRequest(f"env names {bad} are not valid shell variable names")
      kw[name] = tuple(sorted(v.items()))
    allow = body.get("allow") or []
    if not isinstance(allow, list):
      raise BadRequest(f"allow must be a list of 'host:port' strings, got {allow!r}")
    for a in allow:
      parse_hostport(a)
    kw["allow"] = tuple(allow)
    spec = cls(**kw)
    spec.check()
    return spec

  def check(self) -> None:
    if self.network not in ("none", "allowlist"):
      raise BadRequest(f"network must be 'none' or 'allowlist', got {self.network!r}")
    if self.allow and self.network != "allowlist":
      raise BadRequest("allow is only meaningful with network='allowlist'; set network='allowlist'")
    if not self.workdir.startswith("/"):
      raise BadRequest(f"workdir must be an absolute path, got {self.workdir!r}")

  def to_request(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["env"] = dict(self.env)
    d["labels"] = dict(self.labels)
    d["allow"] = list(self.allow)
    return d

  def pool_key(self) -> tuple:
    """Specs with the same key can be served by the same pre-started container."""
    return (
      self.image,
      self.cpus,
      self.memory_mb,
      self.pids,
      self.disk_mb,
      self.network,
      self.allow,
      self.env,
      self.workdir,
      self.user,
      self.read_only,
      self.from_snapshot,
    )
