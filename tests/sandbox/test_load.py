"""Load: 32 sandboxes created concurrently, 20 execs each, no failure; p50/p99 reported."""

import asyncio
import time

import numpy as np
import pytest

from ale.sandbox import Client


@pytest.mark.slow
async def test_32_sandboxes_20_execs(base_image, leftovers, capsys):
  async with Client(admission_timeout_s=120) as c:
    t0 = time.monotonic()
    sbs = await asyncio.gather(
      *(c.create(cpus=0.5, memory_mb=128, labels={"i": str(i)}) for i in range(32))
    )
    t_create = time.monotonic() - t0
    lat = []

    async def work(i, sb):
      for j in range(20):
        t = time.perf_counter()
        r = await sb.exec(f"echo {i}-{j}", timeout_s=60)
        lat.append(time.perf_counter() - t)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, f"{i}-{j}\n", False), r

    t0 = time.monotonic()
    await asyncio.gather(*(work(i, sb) for i, sb in enumerate(sbs)))
    t_exec = time.monotonic() - t0
    assert len(lat) == 640
    assert len({s["id"] for s in await c.list()}) == 32
    await asyncio.gather(*(sb.close() for sb in sbs))
    p50, p99 = np.percentile(lat, [50, 99]) * 1000
    with capsys.disabled():
      print(
        f"\n[load] 32 creates in {t_create:.1f}s; 640 execs in {t_exec:.1f}s "
        f"({640 / t_exec:.0f}/s); exec p50 {p50:.0f} ms, p99 {p99:.0f} ms"
      )
  assert leftovers() == []
