"""A small asyncio client for the Docker Engine API (the hot path of the sandbox service).

JSON calls go through one keep-alive aiohttp session (unix socket or TCP). Starting an
exec hijacks a fresh raw connection (`Upgrade: tcp`) so that stdin can be streamed and
half-closed, and stdout/stderr are demultiplexed frame by frame with a byte cap — which
is what docker-py's `exec_run` does, without a thread hop.
"""

from __future__ import annotations

import asyncio
import json
import struct
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

API_VERSION = "v1.41"  # Docker 20.10; newer engines accept it too


class EngineError(Exception):
  """A non-2xx answer from the engine: `status` and the engine's message."""

  def __init__(self, status: int, message: str):
    super().__init__(f"docker engine answered {status}: {message}")
    self.status = status
    self.message = message


def parse_engine_url(url: str) -> tuple[str, str | None, tuple[str, int] | None]:
  """unix:///path or tcp://host:port -> (http base url, unix path, (host, port))."""
  u = urllib.parse.urlparse(url)
  if u.scheme == "unix":
    return "http://docker", u.path, None
  if u.scheme in ("tcp", "http"):
    if not u.hostname or not u.port:
      raise ValueError(f"engine url {url!r} needs a host and a port, e.g. tcp://127.0.0.1:2375")
    return f"http://{u.hostname}:{u.port}", None, (u.hostname, u.port)
  raise ValueError(f"engine url {url!r}: expected unix:///var/run/docker.sock or tcp://host:port")


class Engine:
  """Async Engine API client. Create inside the event loop that uses it."""

  def __init__(self, url: str = "unix:///var/run/docker.sock"):
    self.url = url
    self._base, self._unix, self._tcp = parse_engine_url(url)
    conn = (
      aiohttp.UnixConnector(path=self._unix, limit=64)
      if self._unix
      else aiohttp.TCPConnector(limit=64)
    )
    self._session = aiohttp.ClientSession(
      connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
    )

  async def close(self) -> None:
    await self._session.close()

  def _url(self, path: str) -> str:
    return f"{self._base}/{API_VERSION}{path}"

  async def request(
    self,
    method: str,
    path: str,
    *,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    data: bytes | None = None,
    timeout: float | None = 120.0,
    raw: bool = False,
  ) -> Any:
    """One JSON call. Returns the decoded JSON (or bytes when raw / not JSON)."""
    if params:
      params = {
        k: (
          json.dumps(v)
          if isinstance(v, dict | list)
          else str(v).lower()
          if isinstance(v, bool)
          else str(v)
        )
        for k, v in params.items()
      }
    headers = {"Content-Type": "application/json"} if json_body is not None else None
    body = json.dumps(json_body).encode() if json_body is not None else data
    async with self._session.request(
      method,
      self._url(path),
      data=body,
      params=params,
      headers=headers,
      timeout=aiohttp.ClientTimeout(total=timeout),
    ) as resp:
      payload = await resp.read()
      if resp.status >= 400:
        try:
          msg = json.loads(payload).get("message", payload.decode(errors="replace"))
        except ValueError:
          msg = payload.decode(errors="replace")
        raise EngineError(resp.status, msg)
      if raw:
        return payload
      if payload and resp.content_type == "application/json":
        return json.loads(payload)
      return payload

  async def events(self, filters: dict[str, list[str]]) -> AsyncIterator[dict[str, Any]]:
    """Streams engine events matching filters (never returns while the engine is up)."""
    async with self._session.get(
      self._url("/events"),
      params={"filters": json.dumps(filters)},
      timeout=aiohttp.ClientTimeout(total=None),
    ) as resp:
      if resp.status >= 400:
        raise EngineError(resp.status, (await resp.read()).decode(errors="replace"))
      buf = b""
      async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n" in buf:
          line, buf = buf.split(b"\n", 1)
          if line.strip():
            yield json.loads(line)

  async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if self._unix:
      return await asyncio.open_unix_connection(self._unix, limit=1 << 20)
    return await asyncio.open_connection(*self._tcp, limit=1 << 20)

  async def attach(self, cid: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Hijacks an attach stream (stdin, stdout, stderr; no log replay) to a container.

    Returns the raw connection after the engine's `101 UPGRADED`: writes go to the
    container's stdin, reads are multiplexed frames (8-byte header: stream, size).
    Attaching before `start` is how nothing the process prints is missed.
    """
    reader, writer = await self._open()
    try:
      host = "docker" if self._unix else f"{self._tcp[0]}:{self._tcp[1]}"
      writer.write(
        (
          f"POST /{API_VERSION}/containers/{cid}/attach?stream=1&stdin=1&stdout=1&stderr=1 "
          f"HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
          f"Content-Length: 0\r\n\r\n"
        ).encode()
      )
      head = await reader.readuntil(b"\r\n\r\n")
      status = int(head.split(b" ", 2)[1])
      if status >= 400:
        rest = await reader.read(65536)
        raise EngineError(status, (head + rest).decode(errors="replace").split("\r\n\r\n", 1)[-1])
      return reader, writer
    except BaseException:
      writer.close()
      raise

  async def exec_start(
    self, exec_id: str, *, stdin: bytes | None, cap: int
  ) -> tuple[bytes, bytes, bool]:
    """Starts a created exec and collects (stdout, stderr, truncated) until it ends.

    Each stream keeps at most `cap` bytes; the rest is read and dropped so the process
    never blocks on a full pipe. Cancelling the coroutine closes the connection.
    """
    reader, writer = await self._open()
    try:
      body = b'{"Detach":false,"Tty":false}'
      host = "docker" if self._unix else f"{self._tcp[0]}:{self._tcp[1]}"
      writer.write(
        (
          f"POST /{API_VERSION}/exec/{exec_id}/start HTTP/1.1\r\nHost: {host}\r\n"
          f"Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
          f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
      )
      head = await reader.readuntil(b"\r\n\r\n")
      status = int(head.split(b" ", 2)[1])
      if status >= 400:
        rest = await reader.read(65536)
        raise EngineError(status, (head + rest).decode(errors="replace").split("\r\n\r\n", 1)[-1])
      if stdin is not None:
        writer.write(stdin)
        await writer.drain()
        if writer.can_write_eof():
          writer.write_eof()
      out = [bytearray(), bytearray()]
      truncated = False
      while True:
        try:
          hdr = await reader.readexactly(8)
        except asyncio.IncompleteReadError:
          break
        kind, size = hdr[0], struct.unpack(">I", hdr[4:])[0]
        buf = out[0] if kind != 2 else out[1]
        remaining = size
        while remaining:
          chunk = await reader.read(min(remaining, 1 << 16))
          if not chunk:
            remaining = 0
            break
          remaining -= len(chunk)
          room = cap - len(buf)
          if room > 0:
            buf += chunk[:room]
          if len(chunk) > max(room, 0):
            truncated = True
      return bytes(out[0]), bytes(out[1]), truncated
    finally:
      writer.close()
