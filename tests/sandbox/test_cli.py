"""`ale-sandbox serve` as a process: health, and a crash + restart finds its sandboxes again."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp

from ale.sandbox import Client
from ale.sandbox import backend as bk


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


async def _serve(name, port, tmp_path, *extra):
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
  }
  p = subprocess.Popen(
    [sys.executable, "-m", "ale.sandbox.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--name", name,
     "--audit-log", str(tmp_path / "audit.jsonl"), "--engine", "unix:///var/run/docker.sock", *extra],
    env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"serve-{port}.log", "w"),
  )  # fmt: skip
  url = f"http://127.0.0.1:{port}"
  async with aiohttp.ClientSession() as s:
    for _ in range(300):
      try:
        async with s.get(f"{url}/v1/health") as r:
          if r.status == 200:
            return p, url
      except aiohttp.ClientError:
        pass
      if p.poll() is not None:
        raise RuntimeError((tmp_path / f"serve-{port}.log").read_text())
      await asyncio.sleep(0.05)
  p.kill()
  raise RuntimeError("ale-sandbox serve did not answer /v1/health")


async def test_serve_crash_restart_adopts_then_shutdown_cleans(docker_client, base_image, tmp_path):
  name = f"cli-test-{time.monotonic_ns()}"
  flt = {"label": [f"{bk.L_SERVICE}={name}"]}

  def leftovers():
    return [c.name for c in docker_client.containers.list(all=True, filters=flt)] + [
      n.name for n in docker_client.networks.list(filters=flt)
    ]

  port = _free_port()
  p, url = await _serve(name, port, tmp_path, "--keep-on-exit")
  try:
    async with Client(url) as c:
      sb = await c.create()
      await sb.write("/workspace/x", b"before crash")
    p.send_signal(signal.SIGKILL)  # a crash: nothing is cleaned up
    p.wait(10)
    assert f"ale-{sb.id}" in leftovers()
    p, url = await _serve(name, port, tmp_path)
    async with Client(url) as c:
      again = c.sandbox(sb.id)
      assert (await again.status())["state"] == "running"
      assert await again.read("/workspace/x") == b"before crash"
      assert (await c.health())["ok"]
    p.send_signal(signal.SIGTERM)  # graceful, without --keep-on-exit: sandboxes removed
    p.wait(30)
    assert leftovers() == []
  finally:
    if p.poll() is None:
      p.kill()
    for c in docker_client.containers.list(all=True, filters=flt):  # only on failure
      c.remove(force=True)
  async with Client(url) as c:  # the service is gone
    try:
      await c.health()
      raise AssertionError("service still answering")
    except aiohttp.ClientError:
      pass
