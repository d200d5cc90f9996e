"""Allowlist egress through the Rocklet, against servers this test starts on this machine."""

import asyncio
import ipaddress

import pytest

from ale.sandbox import Client
from ale.sandbox.egress import rocklet_config, sandbox_network_settings


def test_rocklet_config_pure():
  cfg = rocklet_config(["172.17.0.1:8080", "example.org:443", "other.org:443"])
  assert cfg["allow"] == [["172.17.0.1", 8080], ["example.org", 443], ["other.org", 443]]
  assert cfg["listen"] == [[8080, "172.17.0.1", 8080], [443, "example.org", 443]]
  hosts, env = sandbox_network_settings(["example.org:443", "10.0.0.1:80"], "10.213.0.2")
  assert hosts == ["example.org:10.213.0.2", "rocklet:10.213.0.2"]
  assert env["https_proxy"] == "http://rocklet:3128"


class Server:
  """A tiny HTTP server on the docker bridge gateway that counts connections."""

  def __init__(self, body: bytes):
    self.body, self.hits = body, 0

  async def handle(self, r, w):
    self.hits += 1
    try:
      await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    except Exception:
      pass
    w.write(
      b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
      % (len(self.body), self.body)
    )
    await w.drain()
    w.close()

  async def start(self, host):
    self.server = await asyncio.start_server(self.handle, host, 0)
    self.port = self.server.sockets[0].getsockname()[1]
    return self


@pytest.fixture
def gateway(docker_client):
  cfg = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]
  # The engine's default bridge gateway (this machine's docker0 address).
  return cfg.get("Gateway") or str(ipaddress.ip_network(cfg["Subnet"])[1])


async def test_allowlist_forwards_only_listed_targets(base_image, gateway, leftovers, tmp_path):
  allowed = await Server(b"hello-allowed").start(gateway)
  denied = await Server(b"secret").start(gateway)
  anyhost = await Server(b"host-service").start("0.0.0.0")
  audit = tmp_path / "audit.jsonl"
  try:
    async with Client(audit_path=str(audit)) as c:
      sb = await c.create(network="allowlist", allow=[f"{gateway}:{allowed.port}"])
      ok = f"http://{gateway}:{allowed.port}/"
      bad = f"http://{gateway}:{denied.port}/"
      # The proxy env routes ordinary HTTP clients through the Rocklet.
      r = await sb.exec(f"curl -s -m 10 {ok}", timeout_s=20)
      assert r.stdout == "hello-allowed", r
      r = await sb.exec(f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' {bad}", timeout_s=20)
      assert r.stdout == "403"
      # CONNECT tunnels obey the same list.
      r = await sb.exec(f"curl -s -m 10 -p {ok}", timeout_s=20)
      assert r.stdout == "hello-allowed"
      r = await sb.exec(f"curl -s -m 10 -p {bad}", timeout_s=20)
      assert r.exit_code != 0
      # Transparent TCP to rocklet:PORT reaches the listed target.
      r = await sb.exec(
        f"exec 3<>/dev/tcp/rocklet/{allowed.port}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
        timeout_s=20,
      )
      assert r.stdout.endswith("hello-allowed"), r
      # Around the proxy there is no route: not to the listed host, not to the host side of the bridge.
      r = await sb.exec(f"curl -s -m 2 --noproxy '*' {ok}", timeout_s=20)
      assert r.exit_code != 0
      r = await sb.exec("timeout 2 getent hosts deb.debian.org", timeout_s=20)
      assert r.exit_code != 0 and "deb.debian.org" not in r.stdout
      # The bridge has no host address (inhibit_ipv4): a host listener on 0.0.0.0 is unreachable.
      r = await sb.exec("ip route | awk '/default/ {print $3}'", timeout_s=20)
      gw = r.stdout.strip() or "10.213.0.1"
      r = await sb.exec(f"curl -s -m 2 --noproxy '*' http://{gw}:{anyhost.port}/", timeout_s=20)
      assert r.exit_code != 0 and anyhost.hits == 0
      r = await sb.exec(f"curl -s -m 2 --noproxy '*' http://rocklet:{denied.port}/", timeout_s=20)
      assert r.exit_code != 0
      events = await sb.egress_log()
      opened = [e for e in events if e["event"] == "open"]
      denies = [e for e in events if e["event"] == "deny"]
      assert {e["target"] for e in opened} == {f"{gateway}:{allowed.port}"} and len(opened) == 3
      assert {e["target"] for e in denies} == {f"{gateway}:{denied.port}"} and len(denies) == 2
      await sb.close()
      recs = c.service.audit.recent(event="egress", id=sb.id)
      assert {r["kind"] for r in recs} >= {"ready", "open", "close", "deny"}
    assert denied.hits == 0 and allowed.hits == 3
    assert leftovers() == []
  finally:
    allowed.server.close()
    denied.server.close()
    anyhost.server.close()
