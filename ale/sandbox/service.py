"""The sandbox service: ROCK's control plane over one or more Docker engines (PAPER.md "ROCK").

`SandboxService` holds the state (sandboxes, warm pools, admission, audit, metrics, GEM
environments) and is driven either in-process (the embedded `Client()`) or over REST by
`make_app(service)` (aiohttp; `ale-sandbox serve`). Routes:

  POST   /v1/sandboxes                 create  -> 201 {id, state, ...}
  GET    /v1/sandboxes                 list
  GET    /v1/sandboxes/{id}            state, health, usage, reason when failed
  DELETE /v1/sandboxes/{id}
  POST   /v1/sandboxes/{id}/exec       {cmd, timeout_s, cwd, env, stdin} -> ExecResult
  PUT    /v1/sandboxes/{id}/files?path=...[&mode=644][&extract=tar]   bytes in
  GET    /v1/sandboxes/{id}/files?path=...                            bytes out (tar for a dir)
  POST   /v1/sandboxes/{id}/commit     {tag} -> {image}
  GET    /v1/sandboxes/{id}/egress     the Rocklet's connection log
  POST   /v1/pools                     {spec..., size} warm pool for a spec
  POST   /v1/envs {env_id, kwargs}; POST /v1/envs/{id}/reset|step; DELETE /v1/envs/{id}
  GET    /v1/health; GET /v1/metrics (Prometheus text)

Lifecycle: sandboxes past their TTL or idle timeout are deleted by a reaper that sleeps
until the next deadline; containers that die (crash, OOM) are marked `failed` with the
reason from Docker's event stream; on start the service adopts its own running
sandboxes from a previous run and removes every other object carrying its labels, and
objects of any dead owner process on this host.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import secrets
import socket
import time
from typing import Any

from aiohttp import web

from ale.sandbox import backend as bk
from ale.sandbox.admission import Admission, Capacity
from ale.sandbox.audit import AuditLog
from ale.sandbox.spec import BadRequest, ExecResult, NotFound, SandboxError, SandboxSpec

log = logging.getLogger("ale.sandbox")

EXEC_BUCKETS = (
  0.005,
  0.01,
  0.02,
  0.05,
  0.1,
  0.25,
  0.5,
  1.0,
  2.5,
  5.0,
  10.0,
  30.0,
  60.0,
  float("inf"),
)


@dataclasses.dataclass(slots=True)
class SandboxRecord:
  id: str
  engine: str
  spec: SandboxSpec
  state: str = "pending"  # pending | running | failed | deleted
  container: str | None = None
  network: str | None = None
  rocklet: str | None = None
  reason: str | None = None
  created_at: float = dataclasses.field(default_factory=time.time)
  deadline: float = 0.0
  last_used: float = dataclasses.field(default_factory=time.monotonic)
  oom_kills: int = 0
  execs: int = 0
  from_pool: bool = False
  ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
  closing: bool = False
  status: int = 500  # HTTP status of the error when state == "failed" at start

  def made(self) -> dict[str, Any]:
    return {"container": self.container, "network": self.network, "rocklet": self.rocklet}

  def summary(self) -> dict[str, Any]:
    return {
      "id": self.id,
      "state": self.state,
      "reason": self.reason,
      "engine": self.engine,
      "image": self.spec.from_snapshot or self.spec.image,
      "network": self.spec.network,
      "labels": dict(self.spec.labels),
      "created_at": self.created_at,
      "expires_at": self.deadline,
      "oom_kills": self.oom_kills,
      "execs": self.execs,
      "from_pool": self.from_pool,
      "container": self.container,
    }


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


@contextlib.asynccontextmanager
async def _env_errors():
  """Maps an environment's complaints to 4xx (out-of-order calls: 409; bad input: 400)."""
  try:
    yield
  except (ValueError, TypeError) as e:
    raise BadRequest(f"the environment rejected the request: {e}") from None
  except RuntimeError as e:
    if type(e).__name__ == "EpisodeError":
      raise SandboxError(f"{e} (reset the environment first)", status=409) from None
    raise


class SandboxService:
  """Sandboxes over Docker engines. Create, then `await start()`; `await close()` at the end.

  Args:
    engines: Docker endpoints (`unix:///var/run/docker.sock`, `tcp://host:2375`); each
      is one worker host.
    name: the service's identity in container labels; a restarted service with the same
      name adopts its running sandboxes. Default: unique per process (embedded use).
    audit_path: JSONL audit file (None: in memory only).
    max_output_bytes: cap of stdout and of stderr per exec (truncation is flagged).
    pool_size: keep this many started containers ready for every spec created so far
      (0: only pools asked for with `warm`).
    idle_timeout_s: delete sandboxes with no call for this long (None: never).
    max_sandboxes, cpu_overcommit, memory_overcommit: per-engine capacity: count, and
      the engine's CPUs / memory times these factors.
    admission_timeout_s: how long a create waits for capacity by default.
    keep_on_close: leave sandboxes running at close (a restart adopts them).
  """

  def __init__(
    self,
    engines: tuple[str, ...] | list[str] = ("unix:///var/run/docker.sock",),
    *,
    name: str | None = None,
    audit_path: str | None = None,
    max_output_bytes: int = 1 << 20,
    pool_size: int = 0,
    idle_timeout_s: float | None = None,
    max_sandboxes: int = 128,
    cpu_overcommit: float = 16.0,
    memory_overcommit: float = 2.0,
    admission_timeout_s: float = 30.0,
    keep_on_close: bool = False,
  ):
    if not engines:
      raise ValueError("SandboxService needs at least one engine url")
    self.engine_urls = list(engines)
    self.name = name or f"embedded-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    self.audit = AuditLog(audit_path)
    self.max_output_bytes = int(max_output_bytes)
    self.pool_size = int(pool_size)
    self.idle_timeout_s = idle_timeout_s
    self.max_sandboxes = max_sandboxes
    self.cpu_overcommit = cpu_overcommit
    self.memory_overcommit = memory_overcommit
    self.admission_timeout_s = admission_timeout_s
    self.keep_on_close = keep_on_close
    self.backends: dict[str, bk.DockerBackend] = {}
    self.admission: Admission | None = None
    self.sandboxes: dict[str, SandboxRecord] = {}
    self.by_container: dict[str, SandboxRecord] = {}
    self.pools: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
    self.pool_targets: dict[tuple, tuple[SandboxSpec, int]] = {}
    self._pool_filling: set[tuple] = set()
    self.envs: dict[str, Any] = {}
    self._tasks: list[asyncio.Task] = []
    self._bg: set[asyncio.Task] = set()
    self._wake = asyncio.Event()
    self.started = False
    self.counters = collections.Counter()
    self.exec_hist = [0] * len(EXEC_BUCKETS)
    self.exec_sum = 0.0
    self.adopted: list[str] = []
    self.reaped: list[str] = []

  # ------------------------------------------------------------ lifecycle

  async def start(self) -> SandboxService:
    if self.started:
      return self
    caps = []
    for i, url in enumerate(self.engine_urls):
      b = bk.DockerBackend(url, name=f"engine{i}")
      try:
        await b.open()
      except Exception as e:
        await b.close()
        raise SandboxError(
          f"cannot reach the Docker engine at {url} ({type(e).__name__}: {e}); start one with scripts/docker_up.sh",
          status=503,
        ) from None
      self.backends[b.name] = b
      caps.append(
        Capacity(
          b.name,
          cpus=b.ncpu * self.cpu_overcommit,
          memory_mb=int(b.mem_total / (1 << 20) * self.memory_overcommit) or 1 << 20,
          sandboxes=self.max_sandboxes,
        )
      )
    self.admission = Admission(caps)
    for b in self.backends.values():
      await self._reap_orphans(b)
      self._tasks.append(asyncio.ensure_future(self._watch_events(b)))
    self._tasks.append(asyncio.ensure_future(self._reaper()))
    self.started = True
    self.audit.record(
      "service_start",
      service=self.name,
      engines=self.engine_urls,
      adopted=self.adopted,
      reaped=self.reaped,
    )
    return self

  async def close(self) -> None:
    if not self.started:
      return
    self.started = False
    for t in self._tasks:
      t.cancel()
    for t in list(self._bg):
      t.cancel()
    await asyncio.gather(*self._tasks, *self._bg, return_exceptions=True)
    for env_id in list(self.envs):
      await self.env_close(env_id)
    jobs = []
    for dq in self.pools.values():
      while dq:
        engine, made, spec = dq.popleft()
        jobs.append(self._drop_pooled(engine, made, spec))
    if not self.keep_on_close:
      jobs += [
        self.delete(sid, reason="service closed")
        for sid, r in list(self.sandboxes.items())
        if r.state != "deleted"
      ]
    await asyncio.gather(*jobs, return_exceptions=True)
    self.audit.record("service_stop", service=self.name, kept=self.keep_on_close)
    for b in self.backends.values():
      await b.close()
    self.audit.close()

  async def _reap_orphans(self, b: bk.DockerBackend) -> None:
    """Adopts our running sandboxes from a previous run; removes every other leftover."""
    host = socket.gethostname()

    def dead_owner(labels: dict[str, str]) -> bool:
      if labels.get(bk.L_OWNER_HOST) != host:
        return False
      try:
        return not _alive(int(labels.get(bk.L_OWNER_PID, "0")))
      except ValueError:
        return True

    containers = await b.list_ours("containers")
    adopt: dict[str, dict] = {}
    remove = []
    for c in containers:
      lab = c.get("Labels") or {}
      mine = lab.get(bk.L_SERVICE) == self.name
      if not (mine or dead_owner(lab)):
        continue
      names = [n.lstrip("/") for n in c.get("Names") or []]
      sid = next(
        (n[4:] for n in names if n.startswith("ale-sb-") and not n.endswith("-rocklet")), None
      )
      role = lab.get(bk.L_ROLE)
      if mine and c.get("State") == "running" and role in ("sandbox", "pool") and sid:
        adopt.setdefault(sid, {})["container"] = c
      elif mine and role == "rocklet" and c.get("State") == "running":
        adopt.setdefault(lab.get(bk.L_ID, ""), {})["rocklet"] = c
      else:
        remove.append(c["Id"])
    networks = await b.list_ours("networks")
    for sid, parts in adopt.items():
      c = parts.get("container")
      if c is None:
        remove.append(parts["rocklet"]["Id"])
        continue
      lab = c["Labels"]
      try:
        spec = SandboxSpec.from_request(json.loads(lab.get(bk.L_SPEC, "{}")))
      except (ValueError, SandboxError):
        remove.append(c["Id"])
        continue
      net = next((n["Id"] for n in networks if (n.get("Labels") or {}).get(bk.L_ID) == sid), None)
      rocklet = parts.get("rocklet")
      if spec.network == "allowlist" and (net is None or rocklet is None):
        remove += [c["Id"]] + ([rocklet["Id"]] if rocklet else [])
        continue
      deadline = float(lab.get(bk.L_DEADLINE) or (time.time() + spec.ttl_s))
      rec = SandboxRecord(
        id=sid,
        engine=b.name,
        spec=spec,
        state="running",
        container=c["Id"],
        network=net,
        rocklet=rocklet["Id"] if rocklet else None,
        deadline=deadline,
        created_at=float(c.get("Created", time.time())),
      )
      rec.ready.set()
      self.sandboxes[sid] = rec
      self.by_container[c["Id"]] = rec
      if rec.rocklet:
        self.by_container[rec.rocklet] = rec
      self.admission.reserve_now(b.name, spec.cpus, spec.memory_mb)
      self.adopted.append(sid)
    await asyncio.gather(*(b.remove_container(cid) for cid in remove), return_exceptions=True)
    self.reaped += remove
    keep_nets = {r.network for r in self.sandboxes.values()}
    for n in networks:
      lab = n.get("Labels") or {}
      if n["Id"] not in keep_nets and (lab.get(bk.L_SERVICE) == self.name or dead_owner(lab)):
        await b._remove_network(n["Id"])
        self.reaped.append(n["Id"])

  async def _watch_events(self, b: bk.DockerBackend) -> None:
    filters = {
      "type": ["container"],
      "label": [f"{bk.L_SERVICE}={self.name}"],
      "event": ["die", "oom"],
    }
    while True:
      try:
        async for ev in b.engine.events(filters):
          await self._on_event(b, ev)
      except asyncio.CancelledError:
        raise
      except Exception as e:
        log.warning("event stream of %s broke (%r); reconnecting", b.name, e)
        await asyncio.sleep(1.0)

  async def _on_event(self, b: bk.DockerBackend, ev: dict[str, Any]) -> None:
    cid = ev.get("id") or ev.get("Actor", {}).get("ID")
    rec = self.by_container.get(cid)
    action = ev.get("Action") or ev.get("status")
    if action == "oom":
      self.counters["oom_kills"] += 1
      if rec:
        rec.oom_kills += 1
        self.audit.record("oom_kill", id=rec.id)
      return
    if action == "die" and rec and not rec.closing and rec.state in ("running", "pending"):
      attrs = ev.get("Actor", {}).get("Attributes", {})
      try:
        st = (await b.inspect(cid))["State"]
        oom, code = st.get("OOMKilled"), st.get("ExitCode")
      except Exception:
        oom, code = False, attrs.get("exitCode")
      who = "egress proxy (Rocklet)" if cid == rec.rocklet else "container"
      rec.state = "failed"
      rec.reason = f"{who} was OOM-killed" if oom else f"{who} exited with code {code}"
      conn = b._agents.get(cid)
      if conn is not None:  # the runtime agent is the container's main process
        rec.reason += " (its runtime agent, the main process, ended)"
      self.counters["failed"] += 1
      self.audit.record("failed", id=rec.id, reason=rec.reason)

  async def _reaper(self) -> None:
    """Deletes sandboxes past their TTL or idle timeout; sleeps until the next deadline."""
    while True:
      now_wall, now = time.time(), time.monotonic()
      nxt = 60.0
      for r in list(self.sandboxes.values()):
        if r.state == "deleted" or r.closing:
          continue
        if r.deadline and now_wall >= r.deadline:
          self._spawn(self.delete(r.id, reason="ttl expired"))
          continue
        nxt = min(nxt, r.deadline - now_wall) if r.deadline else nxt
        if self.idle_timeout_s is not None and r.state == "running":
          idle = now - r.last_used
          if idle >= self.idle_timeout_s:
            self._spawn(self.delete(r.id, reason="idle timeout"))
            continue
          nxt = min(nxt, self.idle_timeout_s - idle)
      self._wake.clear()
      waiter = asyncio.ensure_future(self._wake.wait())
      try:
        await asyncio.wait({waiter}, timeout=max(0.05, nxt))
      finally:
        waiter.cancel()

  def _spawn(self, coro) -> asyncio.Task:
    t = asyncio.ensure_future(coro)
    self._bg.add(t)
    t.add_done_callback(self._bg.discard)
    return t

  # ------------------------------------------------------------ sandboxes

  def _labels(
    self, sid: str | None, role: str, spec: SandboxSpec, deadline: float | None
  ) -> dict[str, str]:
    lab = {
      **{f"ale.user.{k}": v for k, v in spec.labels},
      **bk.owner_labels(self.name),
      bk.L_ROLE: role,
      bk.L_SPEC: json.dumps(spec.to_request()),
    }
    if sid:
      lab[bk.L_ID] = sid
    if deadline:
      lab[bk.L_DEADLINE] = f"{deadline:.3f}"
    return lab

  def _record(self, sid: str) -> SandboxRecord:
    r = self.sandboxes.get(sid)
    if r is None or r.state == "deleted":
      raise NotFound(f"no sandbox {sid!r}; list them with GET /v1/sandboxes")
    return r

  async def create(
    self, spec: SandboxSpec, *, wait: bool = True, admission_timeout_s: float | None = None
  ) -> SandboxRecord:
    """Admits, places and starts a sandbox (from the warm pool when one is ready)."""
    if not self.started:
      raise SandboxError("the sandbox service is not started", status=503)
    spec.check()
    timeout = self.admission_timeout_s if admission_timeout_s is None else admission_timeout_s
    sid = "sb-" + secrets.token_hex(6)
    key = spec.pool_key()
    if self.pool_size > 0 and key not in self.pool_targets:
      self.pool_targets[key] = (dataclasses.replace(spec, labels=(), ttl_s=3600.0), self.pool_size)
    dq = self.pools.get(key)
    if dq:
      engine, made, _ = dq.popleft()
      rec = SandboxRecord(
        id=sid, engine=engine, spec=spec, deadline=time.time() + spec.ttl_s, from_pool=True, **made
      )
      rec.state = "running"
      self.sandboxes[sid] = rec
      self.by_container[rec.container] = rec
      rec.ready.set()
      self._wake.set()  # the reaper recomputes its next deadline
      self.counters["pool_hits"] += 1
      self._spawn(self.backends[engine].rename(rec.container, f"ale-{sid}"))
      self._refill(key)
      self.audit.record(
        "create", id=sid, image=spec.image, pool=True, engine=engine, spec=spec.to_request()
      )
      return rec
    await self.backends[next(iter(self.backends))].image_id(spec.from_snapshot or spec.image)
    engine = await self.admission.acquire(spec.cpus, spec.memory_mb, timeout)
    rec = SandboxRecord(id=sid, engine=engine, spec=spec, deadline=time.time() + spec.ttl_s)
    self.sandboxes[sid] = rec
    self._wake.set()
    task = self._spawn(self._start_sandbox(rec))
    self._refill(key)
    if wait:
      await asyncio.shield(task)
      if rec.state == "failed":
        raise SandboxError(f"sandbox {sid} failed to start: {rec.reason}", status=rec.status)
    return rec

  async def _start_sandbox(self, rec: SandboxRecord) -> None:
    b = self.backends[rec.engine]
    try:
      made = await b.create_container(
        rec.spec,
        f"ale-{rec.id}",
        self._labels(rec.id, "sandbox", rec.spec, rec.deadline),
        service=self.name,
      )
      rec.container, rec.network, rec.rocklet = made["container"], made["network"], made["rocklet"]
      self.by_container[rec.container] = rec
      if rec.rocklet:
        self.by_container[rec.rocklet] = rec
      if rec.closing:  # deleted while starting
        await b.remove(made)
        return
      rec.state = "running"
      self.counters["created"] += 1
      self.audit.record(
        "create",
        id=rec.id,
        image=rec.spec.image,
        pool=False,
        engine=rec.engine,
        spec=rec.spec.to_request(),
      )
    except Exception as e:
      rec.state = "failed"
      rec.reason = str(e)
      rec.status = getattr(e, "status", 500)
      self.counters["failed"] += 1
      await self.admission.release(rec.engine, rec.spec.cpus, rec.spec.memory_mb)
      self.audit.record("create_failed", id=rec.id, error=str(e))
    finally:
      rec.ready.set()

  def _refill(self, key: tuple) -> None:
    if key in self.pool_targets and key not in self._pool_filling:
      self._pool_filling.add(key)
      self._spawn(self._fill_pool(key))

  async def _fill_pool(self, key: tuple) -> None:
    try:
      while self.started:
        spec, n = self.pool_targets.get(key, (None, 0))
        dq = self.pools[key]
        if spec is None or len(dq) >= n:
          return
        try:
          engine = await self.admission.acquire(spec.cpus, spec.memory_mb, 0)
        except SandboxError:
          return
        b = self.backends[engine]
        try:
          made = await b.create_container(
            spec,
            f"ale-pool-{secrets.token_hex(6)}",
            self._labels(None, "pool", spec, None),
            service=self.name,
          )
        except Exception as e:
          await self.admission.release(engine, spec.cpus, spec.memory_mb)
          log.warning("warm pool fill failed: %r", e)
          return
        dq.append((engine, made, spec))
    finally:
      self._pool_filling.discard(key)

  async def _drop_pooled(self, engine, made, spec) -> None:
    await self.backends[engine].remove(made)
    await self.admission.release(engine, spec.cpus, spec.memory_mb)

  async def warm(self, spec: SandboxSpec, size: int) -> int:
    """Keeps `size` started containers for this spec; waits until they are ready."""
    if not self.started:
      raise SandboxError("the sandbox service is not started", status=503)
    if not isinstance(size, int) or size < 0:
      raise BadRequest(f"pool size must be a non-negative integer, got {size!r}")
    await self.backends[next(iter(self.backends))].image_id(spec.from_snapshot or spec.image)
    key = spec.pool_key()
    self.pool_targets[key] = (dataclasses.replace(spec, labels=(), ttl_s=3600.0), size)
    dq = self.pools[key]
    while len(dq) > size:
      await self._drop_pooled(*dq.pop())
    while key in self._pool_filling:
      await asyncio.sleep(0.01)
    self._pool_filling.add(key)
    await self._fill_pool(key)
    return len(dq)

  async def wait_ready(self, sid: str, timeout_s: float = 60.0) -> SandboxRecord:
    rec = self._record(sid)
    await asyncio.wait_for(rec.ready.wait(), timeout_s)
    return rec

  async def delete(self, sid: str, *, reason: str = "deleted by client") -> None:
    rec = self._record(sid)
    if rec.closing:
      return
    rec.closing = True
    await rec.ready.wait()
    b = self.backends[rec.engine]
    if rec.rocklet:
      try:
        for ev in await b.rocklet_events(rec.rocklet):
          self.audit.record(
            "egress",
            id=sid,
            **{k: v for k, v in ev.items() if k not in ("event",)},
            kind=ev.get("event"),
          )
      except Exception as e:
        log.warning("collecting egress log of %s: %r", sid, e)
    try:
      await b.remove(rec.made())
    finally:
      if not (rec.state == "failed" and rec.container is None):  # a failed start released already
        await self.admission.release(rec.engine, rec.spec.cpus, rec.spec.memory_mb)
      prior = rec.state
      rec.state = "deleted"
      self.sandboxes.pop(sid, None)
      for c in (rec.container, rec.rocklet):
        self.by_container.pop(c, None)
      self.counters["deleted"] += 1
      self.audit.record("delete", id=sid, reason=reason, prior_state=prior, execs=rec.execs)
      self._wake.set()

  async def info(self, sid: str, *, usage: bool = True) -> dict[str, Any]:
    rec = self._record(sid)
    d = rec.summary()
    if usage and rec.state == "running" and rec.container:
      try:
        d["usage"] = await self.backends[rec.engine].usage(rec.container)
        d["health"] = "ok"
      except Exception as e:
        d["health"] = f"unknown ({e})"
    else:
      d["health"] = "failed" if rec.state == "failed" else rec.state
    return d

  def list(self) -> list[dict[str, Any]]:
    return [r.summary() for r in self.sandboxes.values()]

  async def _running(self, sid: str) -> SandboxRecord:
    rec = self._record(sid)
    if not rec.ready.is_set():
      await rec.ready.wait()
    if rec.state != "running":
      raise SandboxError(f"sandbox {sid} is {rec.state}: {rec.reason}", status=409)
    rec.last_used = time.monotonic()
    return rec

  async def exec(
    self,
    sid: str,
    cmd: str | list[str],
    *,
    timeout_s: float = 60.0,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: str | bytes | None = None,
  ) -> ExecResult:
    rec = await self._running(sid)
    if env is not None and not (
      isinstance(env, dict)
      and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
      raise BadRequest(f"env must be an object of string to string, got {env!r}")
    if cwd is not None and not (isinstance(cwd, str) and cwd.startswith("/")):
      raise BadRequest(f"cwd must be an absolute path, got {cwd!r}")
    if isinstance(stdin, str):
      stdin = stdin.encode()
    elif stdin is not None and not isinstance(stdin, bytes):
      raise BadRequest(f"stdin must be a string or null, got {type(stdin).__name__}")
    res = await self.backends[rec.engine].exec(
      rec.container,
      cmd,
      timeout_s=timeout_s,
      cwd=cwd,
      env=env,
      stdin=stdin,
      cap=self.max_output_bytes,
      image=rec.spec.image,
    )
    rec.execs += 1
    rec.last_used = time.monotonic()
    self._observe(res)
    self.audit.record(
      "exec",
      id=sid,
      cmd=cmd,
      exit_code=res.exit_code,
      duration_s=round(res.duration_s, 6),
      stdout_bytes=len(res.stdout),
      stderr_bytes=len(res.stderr),
      timed_out=res.timed_out,
      truncated=res.truncated,
    )
    return res

  def _observe(self, res: ExecResult) -> None:
    self.counters["execs"] += 1
    if res.timed_out:
      self.counters["timeouts"] += 1
    self.exec_sum += res.duration_s
    for i, le in enumerate(EXEC_BUCKETS):
      if res.duration_s <= le:
        self.exec_hist[i] += 1
        break

  async def read(self, sid: str, path: str) -> tuple[bytes, bool]:
    rec = await self._running(sid)
    data, is_dir = await self.backends[rec.engine].read(rec.container, path)
    self.audit.record("read", id=sid, path=path, bytes=len(data), dir=is_dir)
    return data, is_dir

  async def write(self, sid: str, path: str, data: bytes, mode: int = 0o644) -> None:
    rec = await self._running(sid)
    await self.backends[rec.engine].write(rec.container, path, data, mode)
    self.audit.record("write", id=sid, path=path, bytes=len(data), mode=oct(mode))

  async def put_tar(self, sid: str, remote_dir: str, tar_bytes: bytes) -> None:
    rec = await self._running(sid)
    await self.backends[rec.engine].put_tar(rec.container, remote_dir, tar_bytes)
    self.audit.record("put_dir", id=sid, path=remote_dir, bytes=len(tar_bytes))

  async def commit(self, sid: str, tag: str | None = None) -> str:
    rec = await self._running(sid)
    if tag is not None and (not isinstance(tag, str) or not tag or " " in tag):
      raise BadRequest(f"tag must be an image reference like 'ale/snapshot:step3', got {tag!r}")
    image = await self.backends[rec.engine].commit(rec.container, tag, bk.owner_labels(self.name))
    self.audit.record("commit", id=sid, image=image)
    return image

  async def egress_log(self, sid: str) -> list[dict[str, Any]]:
    rec = await self._running(sid)
    if not rec.rocklet:
      return []
    return await self.backends[rec.engine].rocklet_events(rec.rocklet)

  # ------------------------------------------------------------ GEM over HTTP

  async def env_make(self, env_id: str, kwargs: dict[str, Any] | None = None) -> str:
    if not isinstance(env_id, str) or not env_id:
      raise BadRequest(f"env_id must be a non-empty string, got {env_id!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
      raise BadRequest(f"kwargs must be an object, got {kwargs!r}")
    try:
      import gymnasium  # noqa: PLC0415

      import ale.envs as envs  # noqa: PLC0415 (envs sits above sandbox; imported lazily)
    except ImportError as e:
      raise SandboxError(f"ale.envs is not importable: {e}", status=501) from None
    known = envs.list_envs() if hasattr(envs, "list_envs") else None
    if known is not None and env_id not in known:
      raise NotFound(f"unknown env id {env_id!r}; registered: {known}")
    try:
      env = await asyncio.to_thread(envs.make, env_id, **(kwargs or {}))
    except (gymnasium.error.Error, KeyError) as e:
      raise NotFound(f"unknown env id {env_id!r} ({e}); registered: {known}") from None
    except TypeError as e:
      raise BadRequest(f"bad kwargs for {env_id!r}: {e}") from None
    eid = "env-" + secrets.token_hex(6)
    self.envs[eid] = env
    self.audit.record("env_make", env=eid, env_id=env_id)
    return eid

  def _env(self, eid: str):
    env = self.envs.get(eid)
    if env is None:
      raise NotFound(f"no environment {eid!r}; make one with POST /v1/envs")
    return env

  async def env_reset(
    self, eid: str, seed: int | None = None, options: dict | None = None
  ) -> dict[str, Any]:
    env = self._env(eid)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
      raise BadRequest(f"seed must be an integer or null, got {seed!r}")
    async with _env_errors():
      if hasattr(env, "areset"):
        obs, info = await env.areset(seed=seed, options=options)
      else:
        obs, info = await asyncio.to_thread(env.reset, seed=seed, options=options)
    return {"observation": obs, "info": info}

  async def env_step(self, eid: str, action: Any) -> dict[str, Any]:
    env = self._env(eid)
    if not isinstance(action, str):
      raise BadRequest(f"action must be a string, got {type(action).__name__}")
    async with _env_errors():
      if hasattr(env, "astep"):
        obs, reward, term, trunc, info = await env.astep(action)
      else:
        obs, reward, term, trunc, info = await asyncio.to_thread(env.step, action)
    return {
      "observation": obs,
      "reward": float(reward),
      "terminated": bool(term),
      "truncated": bool(trunc),
      "info": info,
    }

  async def env_close(self, eid: str) -> None:
    env = self.envs.pop(eid, None)
    if env is None:
      raise NotFound(f"no environment {eid!r}")
    if hasattr(env, "aclose"):
      await env.aclose()
    else:
      await asyncio.to_thread(env.close)
    self.audit.record("env_close", env=eid)

  # ------------------------------------------------------------ health & metrics

  async def health(self) -> dict[str, Any]:
    engines = {n: await b.ping() for n, b in self.backends.items()}
    return {
      "ok": self.started and all(engines.values()),
      "service": self.name,
      "engines": engines,
      "sandboxes": len(self.sandboxes),
      "capacity": {n: dataclasses.asdict(c) for n, c in self.admission.caps.items()}
      if self.admission
      else {},
    }

  def metrics(self) -> str:
    states = collections.Counter(r.state for r in self.sandboxes.values())
    pooled = sum(len(d) for d in self.pools.values())
    lines = [
      "# HELP ale_sandbox_sandboxes Sandboxes by state.",
      "# TYPE ale_sandbox_sandboxes gauge",
    ]
    for st in ("pending", "running", "failed"):
      lines.append(f'ale_sandbox_sandboxes{{state="{st}"}} {states.get(st, 0)}')
    lines.append(f'ale_sandbox_sandboxes{{state="pooled"}} {pooled}')
    lines += [
      "# HELP ale_sandbox_exec_seconds Exec round trip inside the service.",
      "# TYPE ale_sandbox_exec_seconds histogram",
    ]
    for le, n in zip(EXEC_BUCKETS, itertools.accumulate(self.exec_hist), strict=True):
      lines.append(
        f'ale_sandbox_exec_seconds_bucket{{le="{"+Inf" if le == float("inf") else le}"}} {n}'
      )
    lines.append(f"ale_sandbox_exec_seconds_sum {self.exec_sum:.6f}")
    lines.append(f"ale_sandbox_exec_seconds_count {self.counters['execs']}")
    rejected = self.admission.rejected if self.admission else 0
    for name, help_, val in (
      ("admissions_rejected_total", "Creates refused for lack of capacity.", rejected),
      ("oom_kills_total", "OOM kills inside sandboxes.", self.counters["oom_kills"]),
      ("exec_timeouts_total", "Execs killed at their deadline.", self.counters["timeouts"]),
      ("created_total", "Sandboxes started cold.", self.counters["created"]),
      ("pool_hits_total", "Sandboxes served from a warm pool.", self.counters["pool_hits"]),
      ("failed_total", "Sandboxes that failed.", self.counters["failed"]),
      ("deleted_total", "Sandboxes deleted.", self.counters["deleted"]),
    ):
      lines += [
        f"# HELP ale_sandbox_{name} {help_}",
        f"# TYPE ale_sandbox_{name} counter",
        f"ale_sandbox_{name} {val}",
      ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- REST app


async def _json(request: web.Request) -> Any:
  if not request.can_read_body:
    return {}
  try:
    return json.loads(await request.read() or b"{}")
  except ValueError as e:
    raise BadRequest(f"request body is not valid JSON: {e}") from None


def _bool_q(request: web.Request, name: str, default: bool) -> bool:
  v = request.query.get(name)
  return default if v is None else v.lower() in ("1", "true", "yes")


@web.middleware
async def _errors(request: web.Request, handler):
  try:
    return await handler(request)
  except SandboxError as e:
    headers = {"Retry-After": str(int(e.retry_after + 0.999))} if e.retry_after else None
    return web.json_response(
      {"error": str(e), "status": e.status}, status=e.status, headers=headers
    )
  except web.HTTPException:
    raise
  except asyncio.CancelledError:
    raise
  except Exception as e:  # a service never crashes on one request
    log.exception("internal error on %s %s", request.method, request.path)
    return web.json_response(
      {"error": f"internal error: {type(e).__name__}: {e}", "status": 500}, status=500
    )


SERVICE_KEY = web.AppKey("service", SandboxService)


def make_app(service: SandboxService, *, manage_lifecycle: bool = True) -> web.Application:
  """The aiohttp application serving `service` (started/closed with the app when asked)."""
  app = web.Application(middlewares=[_errors], client_max_size=1 << 30)
  r = web.RouteTableDef()
  S = service

  @r.post("/v1/sandboxes")
  async def create(req):
    body = await _json(req)
    spec = SandboxSpec.from_request(body)
    wait = body.get("wait", True) if isinstance(body, dict) else True
    if not isinstance(wait, bool):
      raise BadRequest(f"wait must be true or false, got {wait!r}")
    at = body.get("admission_timeout_s")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int | float) or at < 0):
      raise BadRequest(f"admission_timeout_s must be a non-negative number, got {at!r}")
    rec = await S.create(spec, wait=wait, admission_timeout_s=at)
    return web.json_response(rec.summary(), status=201)

  @r.get("/v1/sandboxes")
  async def list_(req):
    return web.json_response({"sandboxes": S.list()})

  @r.get("/v1/sandboxes/{id}")
  async def get(req):
    sid = req.match_info["id"]
    if "wait" in req.query:
      await S.wait_ready(sid, float(req.query.get("timeout", "60")))
    return web.json_response(await S.info(sid, usage=_bool_q(req, "usage", True)))

  @r.delete("/v1/sandboxes/{id}")
  async def delete(req):
    await S.delete(req.match_info["id"])
    return web.json_response({"id": req.match_info["id"], "state": "deleted"})

  @r.post("/v1/sandboxes/{id}/exec")
  async def exec_(req):
    body = await _json(req)
    if not isinstance(body, dict) or "cmd" not in body:
      raise BadRequest("exec body must be a JSON object with 'cmd' (a string or a list of strings)")
    unknown = set(body) - {"cmd", "timeout_s", "cwd", "env", "stdin", "stdin_b64"}
    if unknown:
      raise BadRequest(f"unknown exec field(s) {sorted(unknown)}")
    stdin = body.get("stdin")
    if body.get("stdin_b64") is not None:
      try:
        stdin = base64.b64decode(body["stdin_b64"], validate=True)
      except (ValueError, TypeError):
        raise BadRequest("stdin_b64 is not valid base64") from None
    res = await S.exec(
      req.match_info["id"],
      body["cmd"],
      timeout_s=body.get("timeout_s", 60.0),
      cwd=body.get("cwd"),
      env=body.get("env"),
      stdin=stdin,
    )
    return web.json_response(res.to_json())

  @r.put("/v1/sandboxes/{id}/files")
  async def put_file(req):
    path = req.query.get("path")
    if not path:
      raise BadRequest("missing ?path=/absolute/path")
    data = await req.read()
    if req.query.get("extract") == "tar":
      await S.put_tar(req.match_info["id"], path, data)
    else:
      try:
        mode = int(req.query.get("mode", "644"), 8)
      except ValueError:
        raise BadRequest(f"mode must be octal like 644, got {req.query.get('mode')!r}") from None
      await S.write(req.match_info["id"], path, data, mode)
    return web.json_response({"path": path, "bytes": len(data)})

  @r.get("/v1/sandboxes/{id}/files")
  async def get_file(req):
    path = req.query.get("path")
    if not path:
      raise BadRequest("missing ?path=/absolute/path")
    data, is_dir = await S.read(req.match_info["id"], path)
    return web.Response(
      body=data,
      content_type="application/x-tar" if is_dir else "application/octet-stream",
      headers={"X-Ale-Directory": "1" if is_dir else "0"},
    )

  @r.post("/v1/sandboxes/{id}/commit")
  async def commit(req):
    body = await _json(req)
    tag = body.get("tag") if isinstance(body, dict) else None
    return web.json_response({"image": await S.commit(req.match_info["id"], tag)})

  @r.get("/v1/sandboxes/{id}/egress")
  async def egress_(req):
    return web.json_response({"events": await S.egress_log(req.match_info["id"])})

  @r.post("/v1/pools")
  async def pools(req):
    body = await _json(req)
    if not isinstance(body, dict):
      raise BadRequest("pool body must be a JSON object")
    body = dict(body)
    size = body.pop("size", 1)
    n = await S.warm(SandboxSpec.from_request(body), size)
    return web.json_response({"ready": n})

  @r.post("/v1/envs")
  async def env_make(req):
    body = await _json(req)
    if not isinstance(body, dict):
      raise BadRequest("body must be a JSON object {env_id, kwargs}")
    eid = await S.env_make(body.get("env_id"), body.get("kwargs"))
    return web.json_response({"env_id": eid}, status=201)

  @r.post("/v1/envs/{id}/reset")
  async def env_reset(req):
    body = await _json(req)
    body = body if isinstance(body, dict) else {}
    out = await S.env_reset(req.match_info["id"], body.get("seed"), body.get("options"))
    return web.json_response(out, dumps=lambda o: json.dumps(o, default=str))

  @r.post("/v1/envs/{id}/step")
  async def env_step(req):
    body = await _json(req)
    if not isinstance(body, dict) or "action" not in body:
      raise BadRequest('step body must be {"action": "..."}')
    out = await S.env_step(req.match_info["id"], body["action"])
    return web.json_response(out, dumps=lambda o: json.dumps(o, default=str))

  @r.delete("/v1/envs/{id}")
  async def env_close(req):
    await S.env_close(req.match_info["id"])
    return web.json_response({"env_id": req.match_info["id"], "closed": True})

  @r.get("/v1/health")
  async def health(req):
    h = await S.health()
    return web.json_response(h, status=200 if h["ok"] else 503)

  @r.get("/v1/metrics")
  async def metrics(req):
    return web.Response(text=S.metrics(), content_type="text/plain")

  app.add_routes(r)
  app[SERVICE_KEY] = service
  if manage_lifecycle:

    async def _startup(app):
      await service.start()

    async def _cleanup(app):
      await service.close()

    app.on_startup.append(_startup)
    app.on_cleanup.append(_cleanup)
  return app
