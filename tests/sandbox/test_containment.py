"""Containment: what the paper saw agents try, each leaving the service and neighbours intact.

One victim sandbox per attack (small limits), plus a bystander sandbox that must keep
its file and answer promptly afterwards, and a service health check.
"""

import asyncio
import socket
import threading

import pytest

from ale.sandbox import Client


@pytest.fixture
async def pair(base_image):
  async with Client(admission_timeout_s=5.0) as c:
    bystander = await c.create()
    await bystander.write("/workspace/keep.txt", b"untouched")
    victim = await c.create(memory_mb=128, pids=64, disk_mb=16, cpus=0.5)
    yield c, victim
    assert await bystander.read("/workspace/keep.txt") == b"untouched"
    r = await bystander.exec("echo fine", timeout_s=10)
    assert r.stdout == "fine\n" and r.duration_s < 5
    assert (await c.health())["ok"]
    assert (await victim.status())["state"] in ("running", "failed")


async def test_fork_bomb(pair):
  c, sb = pair
  # Foreground bomb: killed as a process group at the deadline.
  r = await sb.exec("bomb() { bomb | bomb; }; bomb", timeout_s=3)
  assert r.timed_out
  await asyncio.sleep(0.3)
  left = await sb.exec("ps -e --no-headers | wc -l", timeout_s=10)
  assert left.exit_code == 0 and int(left.stdout) < 10, left
  # Classic background bomb: it outlives its command but stays inside its pids limit.
  await sb.exec(":(){ :|:& };:", timeout_s=3)
  usage = (await sb.status())["usage"]
  assert 0 < usage["pids"] <= 64, usage


async def test_memory_bomb(pair):
  c, sb = pair
  r = await sb.exec("python3 -c 'x=[]\nwhile True: x.append(bytearray(16<<20))'", timeout_s=20)
  assert r.exit_code == 137 and not r.timed_out
  st = await sb.status()
  assert st["state"] == "running"
  for _ in range(50):  # the oom event arrives asynchronously
    if (await sb.status())["oom_kills"] >= 1:
      break
    await asyncio.sleep(0.05)
  assert (await sb.status())["oom_kills"] >= 1
  assert "ale_sandbox_oom_kills_total" in await c.metrics()


async def test_disk_fill(pair):
  c, sb = pair
  r = await sb.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=100", timeout_s=20)
  assert r.exit_code != 0 and "No space left" in r.stderr
  r = await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=100", timeout_s=20)
  assert r.exit_code != 0 and "No space left" in r.stderr


async def test_cpu_spin_past_timeout(pair):
  c, sb = pair
  r = await sb.exec("python3 -c 'while True: pass' & python3 -c 'while True: pass'", timeout_s=1.0)
  assert r.timed_out
  ps = await sb.exec("ps -eo args")
  assert "while True" not in ps.stdout


async def test_no_connection_to_host(pair):
  c, sb = pair
  srv = socket.socket()
  srv.bind(("0.0.0.0", 0))
  srv.listen()
  port = srv.getsockname()[1]
  hits = []
  threading.Thread(target=lambda: hits.append(srv.accept()), daemon=True).start()
  try:
    for host in ("127.0.0.1", "172.17.0.1", socket.gethostname()):
      r = await sb.exec(f"timeout 3 bash -c 'echo x > /dev/tcp/{host}/{port}'", timeout_s=10)
      assert r.exit_code != 0, host
    r = await sb.exec("ip -o link | cut -d: -f2; echo routes; ip route", timeout_s=10)
    assert r.stdout.split() == ["lo", "routes"], r.stdout
  finally:
    srv.close()
  assert not hits


async def test_no_dns(pair):
  c, sb = pair
  r = await sb.exec(
    "getent hosts deb.debian.org || python3 -c \"import socket; socket.gethostbyname('pypi.org')\"",
    timeout_s=15,
  )
  assert r.exit_code != 0


async def test_no_mount_setuid_or_rootfs_write(pair):
  c, sb = pair
  r = await sb.exec("mount -t tmpfs none /mnt", timeout_s=10)
  assert r.exit_code != 0
  # setuid binaries do not elevate (no-new-privileges, no capabilities).
  r = await sb.exec("su -c id root </dev/null; ls -l /usr/bin/su; id -u", timeout_s=10)
  assert r.stdout.strip().endswith("1000")
  r = await sb.exec(
    "chmod u+s /workspace 2>&1; cp /bin/bash /tmp/b && chmod u+s /tmp/b && /tmp/b -p -c 'id -u'",
    timeout_s=10,
  )
  assert r.stdout.strip().endswith("1000")
  for path in ("/etc/passwd", "/usr/local/x", "/root/x", "/x"):
    assert (await sb.exec(f"echo hi > {path}", timeout_s=10)).exit_code != 0, path


async def test_proc_sys_probing(pair):
  c, sb = pair
  r = await sb.exec("echo 1 > /proc/sys/kernel/sysrq", timeout_s=10)
  assert r.exit_code != 0
  r = await sb.exec("echo c > /proc/sysrq-trigger", timeout_s=10)
  assert r.exit_code != 0
  r = await sb.exec("cat /proc/kcore | head -c 10 | wc -c", timeout_s=10)
  assert r.stdout.strip() == "0"
  r = await sb.exec("echo 1 > /sys/kernel/mm/ksm/run; touch /sys/fs/cgroup/x", timeout_s=10)
  assert r.exit_code != 0
  r = await sb.exec("ps -e --no-headers | wc -l", timeout_s=10)
  assert int(r.stdout) < 10  # its own pid namespace: no host processes visible


async def test_no_docker_socket(pair):
  c, sb = pair
  r = await sb.exec(
    "ls -la /var/run/docker.sock /run/docker.sock 2>&1; mount | grep -c docker.sock", timeout_s=10
  )
  assert "No such file" in r.stdout and r.stdout.strip().endswith("0")
  r = await sb.exec("curl -s --unix-socket /var/run/docker.sock http://x/version", timeout_s=10)
  assert r.exit_code != 0
