"""Egress allowlist: the per-sandbox proxy (ROCK's "Rocklet", PAPER.md "ROCK").

A sandbox in `allowlist` mode sits alone on an internal Docker network with no address
on the host's side of its bridge (`inhibit_ipv4`), so it can reach neither the host nor
the outside. Its only peer is its Rocklet: a small asyncio proxy, run from the base image
in a locked-down container attached to that network and to the default bridge. The
Rocklet forwards

* HTTP `CONNECT host:port` and absolute-form `GET http://host:port/...` requests on port
  3128 (the sandbox gets `http_proxy`/`https_proxy` pointing at it), and
* plain TCP on each allowed port (`rocklet:PORT`, and `name:PORT` for every allowed host
  name, which the sandbox's /etc/hosts maps to the Rocklet),

only when the target is in the allowlist, and prints one JSON line per connection
(allowed or denied, bytes each way), which the service collects into the audit log.
This answers the paper's safety incidents (probing internal networks, a reverse SSH
tunnel to an outside host): nothing leaves unless listed, and every attempt is visible.
"""

from __future__ import annotations

import ipaddress
import json

from ale.sandbox.spec import parse_hostport

PROXY_PORT = 3128

# Runs inside the Rocklet container as `python3 -c ROCKLET_SCRIPT CONFIG_JSON`.
# CONFIG: {"allow": [[host, port], ...], "listen": [[port, host, port], ...]}.
ROCKLET_SCRIPT = r"""
import asyncio, json, sys, time
CFG = json.loads(sys.argv[1])
ALLOW = {(h.lower(), int(p)) for h, p in CFG["allow"]}

def log(**kw):
  kw["ts"] = round(time.time(), 3)
  print(json.dumps(kw), flush=True)

async def pipe(r, w, counter, key):
  try:
    while True:
      b = await r.read(65536)
      if not b:
        break
      counter[key] += len(b)
      w.write(b)
      await w.drain()
  except Exception:
    pass
  finally:
    try:
      w.write_eof()
    except Exception:
      pass

async def forward(cr, cw, host, port, mode, first=b""):
  peer = cw.get_extra_info("peername")
  client = f"{peer[0]}:{peer[1]}" if peer else "?"
  target = f"{host}:{port}"
  if (host.lower(), port) not in ALLOW:
    log(event="deny", mode=mode, client=client, target=target)
    if mode == "connect" or mode == "http":
      cw.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
      await cw.drain()
    cw.close()
    return
  try:
    ur, uw = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
  except Exception as e:
    log(event="error", mode=mode, client=client, target=target, error=repr(e))
    if mode in ("connect", "http"):
      cw.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
      await cw.drain()
    cw.close()
    return
  log(event="open", mode=mode, client=client, target=target)
  if mode == "connect":
    cw.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await cw.drain()
  if first:
    uw.write(first)
  n = {"up": len(first), "down": 0}
  t0 = time.monotonic()
  await asyncio.gather(pipe(cr, uw, n, "up"), pipe(ur, cw, n, "down"))
  uw.close()
  cw.close()
  log(event="close", mode=mode, client=client, target=target, bytes_up=n["up"], bytes_down=n["down"], seconds=round(time.monotonic() - t0, 3))

def split_hostport(s, default):
  if s.startswith("["):
    h, _, rest = s[1:].partition("]")
    return h, int(rest[1:]) if rest.startswith(":") else default
  h, _, p = s.rpartition(":")
  if not h:
    return s, default
  return h, int(p)

async def handle_proxy(cr, cw):
  try:
    head = await asyncio.wait_for(cr.readuntil(b"\r\n\r\n"), 30)
  except Exception:
    cw.close()
    return
  line = head.split(b"\r\n", 1)[0].decode("latin-1")
  parts = line.split(" ")
  try:
    if len(parts) != 3:
      raise ValueError(line)
    method, target, version = parts
    if method.upper() == "CONNECT":
      host, port = split_hostport(target, 443)
      return await forward(cr, cw, host, port, "connect")
    if not target.lower().startswith("http://"):
      raise ValueError(line)
    rest = target[7:]
    hostport, slash, path = rest.partition("/")
    host, port = split_hostport(hostport, 80)
    lines = head.split(b"\r\n")[1:]
    kept = [h for h in lines if h and not h.lower().startswith((b"proxy-connection:", b"connection:"))]
    req = f"{method} /{path} {version}\r\n".encode() + b"\r\n".join(kept + [b"Connection: close"]) + b"\r\n\r\n"
    return await forward(cr, cw, host, port, "http", first=req)
  except Exception as e:
    log(event="bad_request", line=line[:200], error=repr(e))
    cw.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    cw.close()

async def main():
  servers = [await asyncio.start_server(handle_proxy, "0.0.0.0", CFG["proxy_port"])]
  for lport, host, port in CFG["listen"]:
    async def h(cr, cw, host=host, port=port):
      await forward(cr, cw, host, port, "tcp")
    servers.append(await asyncio.start_server(h, "0.0.0.0", lport))
  log(event="ready", allow=sorted(f"{h}:{p}" for h, p in ALLOW))
  await asyncio.Event().wait()

asyncio.run(main())
"""


def is_ip(host: str) -> bool:
  try:
    ipaddress.ip_address(host)
    return True
  except ValueError:
    return False


def rocklet_config(allow: tuple[str, ...] | list[str]) -> dict:
  """The Rocklet's config: the allow set and the transparent per-port listeners."""
  pairs = [parse_hostport(a) for a in allow]
  listen, used = [], {PROXY_PORT}
  for host, port in pairs:
    if port not in used:
      used.add(port)
      listen.append([port, host, port])
  return {"allow": [list(p) for p in pairs], "listen": listen, "proxy_port": PROXY_PORT}


def sandbox_network_settings(
  allow: tuple[str, ...] | list[str], rocklet_ip: str
) -> tuple[list[str], dict[str, str]]:
  """(ExtraHosts, env) for a sandbox whose Rocklet answers at rocklet_ip."""
  hosts = {"rocklet"} | {h for h, _ in map(parse_hostport, allow) if not is_ip(h)}
  proxy = f"http://rocklet:{PROXY_PORT}"
  env = {
    "http_proxy": proxy,
    "https_proxy": proxy,
    "HTTP_PROXY": proxy,
    "HTTPS_PROXY": proxy,
    "no_proxy": "localhost,127.0.0.1",
    "NO_PROXY": "localhost,127.0.0.1",
  }
  return [f"{h}:{rocklet_ip}" for h in sorted(hosts)], env


def parse_rocklet_log(text: str) -> list[dict]:
  """The Rocklet's stdout -> its JSON events (other lines are skipped)."""
  events = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith("{"):
      try:
        events.append(json.loads(line))
      except ValueError:
        pass
  return events
