"""The REST service on loopback: the Python client over HTTP, bad requests, health, metrics, GEM."""

import json

import aiohttp
import pytest
from aiohttp import web

from ale.sandbox import Client, NotFound, SandboxService, make_app


@pytest.fixture
async def server(base_image, tmp_path):
  service = SandboxService(
    audit_path=str(tmp_path / "audit.jsonl"), admission_timeout_s=2.0, max_sandboxes=3
  )
  runner = web.AppRunner(make_app(service))
  await runner.setup()
  site = web.TCPSite(runner, "127.0.0.1", 0)
  await site.start()
  port = runner.addresses[0][1]
  yield f"http://127.0.0.1:{port}", service
  await runner.cleanup()


async def test_client_over_http(server):
  url, service = server
  async with Client(url) as c:
    async with await c.create(labels={"k": "v"}) as sb:
      r = await sb.exec(["sh", "-c", "cat; echo; echo $X"], env={"X": "y"}, stdin=b"\xffraw")
      assert r.exit_code == 0 and r.stdout.endswith("raw\ny\n")
      await sb.write("/workspace/f.txt", "text")
      assert await sb.read("/workspace/f.txt") == b"text"
      st = await sb.status()
      assert st["state"] == "running" and st["labels"] == {"k": "v"} and "cpu_s" in st["usage"]
      assert [s["id"] for s in await c.list()] == [sb.id]
    with pytest.raises(NotFound):
      await sb.exec("true")
    assert (await c.health())["ok"]
    m = await c.metrics()
    assert 'ale_sandbox_sandboxes{state="running"} 0' in m
    assert (
      'ale_sandbox_exec_seconds_bucket{le="+Inf"} 1' in m
      and "ale_sandbox_exec_timeouts_total 0" in m
    )


async def _req(session, method, url, **kw):
  async with session.request(method, url, **kw) as r:
    return (
      r.status,
      (await r.json()) if r.content_type == "application/json" else await r.text(),
      r.headers,
    )


async def test_bad_requests_get_4xx_with_message(server):
  url, service = server
  async with aiohttp.ClientSession() as s:
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", data=b"{not json")
    assert st == 400 and "not valid JSON" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"image": "ale/nope:0"})
    assert st == 404 and "ale/nope:0" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"cpus": -1})
    assert st == 400 and "cpus" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"memory_mb": "lots"})
    assert st == 400 and "memory_mb" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"bogus": 1})
    assert st == 400 and "bogus" in body["error"]
    st, body, _ = await _req(
      s, "POST", f"{url}/v1/sandboxes", json={"network": "allowlist", "allow": ["nope"]}
    )
    assert st == 400 and "host:port" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"cpus": 1e6})
    assert st == 400 and "ever hold" in body["error"]
    st, body, _ = await _req(s, "GET", f"{url}/v1/sandboxes/sb-unknown")
    assert st == 404 and "sb-unknown" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes/sb-unknown/exec", json={"cmd": "true"})
    assert st == 404
    st, body, _ = await _req(s, "DELETE", f"{url}/v1/sandboxes/sb-unknown")
    assert st == 404
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={})
    assert st == 201 and body["state"] == "running"
    sid = body["id"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes/{sid}/exec", json={"timeout_s": 3})
    assert st == 400 and "cmd" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes/{sid}/exec", json={"cmd": 5})
    assert st == 400 and "cmd must be" in body["error"]
    st, body, _ = await _req(s, "GET", f"{url}/v1/sandboxes/{sid}/files")
    assert st == 400 and "path" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes/{sid}/commit", json={"tag": "bad tag"})
    assert st == 400
    # Over capacity: 429 with Retry-After.
    ids = [sid]
    for _ in range(2):
      ids.append((await _req(s, "POST", f"{url}/v1/sandboxes", json={}))[1]["id"])
    st, body, headers = await _req(
      s, "POST", f"{url}/v1/sandboxes", json={"admission_timeout_s": 0}
    )
    assert st == 429 and int(headers["Retry-After"]) >= 1 and "capacity" in body["error"]
    for i in ids:
      assert (await _req(s, "DELETE", f"{url}/v1/sandboxes/{i}"))[0] == 200
    st, body, _ = await _req(s, "GET", f"{url}/v1/health")
    assert st == 200 and body["ok"] and body["sandboxes"] == 0


async def test_async_create_and_wait(server):
  url, service = server
  async with aiohttp.ClientSession() as s:
    st, body, _ = await _req(s, "POST", f"{url}/v1/sandboxes", json={"wait": False})
    assert st == 201 and body["state"] in ("pending", "running")
    st, body, _ = await _req(s, "GET", f"{url}/v1/sandboxes/{body['id']}?wait=1&timeout=30")
    assert st == 200 and body["state"] == "running"
    await _req(s, "DELETE", f"{url}/v1/sandboxes/{body['id']}")


async def test_gem_over_http(server):
  url, service = server
  async with aiohttp.ClientSession() as s:
    st, body, _ = await _req(s, "POST", f"{url}/v1/envs", json={"env_id": "ale/NoSuchEnv-v9"})
    assert st == 404 and "NoSuchEnv" in body["error"] and "registered" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/envs/env-nope/step", json={"action": "x"})
    assert st == 404
  import ale.envs

  assert "ale/SimFiles-v0" in ale.envs.list_envs()
  async with aiohttp.ClientSession() as s:
    st, body, _ = await _req(
      s, "POST", f"{url}/v1/envs", json={"env_id": "ale/SimFiles-v0", "kwargs": {}}
    )
    assert st == 201
    eid = body["env_id"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/envs/{eid}/step", json={"action": "early"})
    assert st == 409 and "reset" in body["error"]
    st, body, _ = await _req(s, "POST", f"{url}/v1/envs/{eid}/reset", json={"seed": 0})
    assert st == 200 and isinstance(body["observation"], str) and isinstance(body["info"], dict)
    st, body, _ = await _req(
      s, "POST", f"{url}/v1/envs/{eid}/step", json={"action": "not a tool call"}
    )
    assert st == 200 and isinstance(body["observation"], str) and isinstance(body["reward"], float)
    assert json.dumps(body)
    st, _, _ = await _req(s, "DELETE", f"{url}/v1/envs/{eid}")
    assert st == 200
