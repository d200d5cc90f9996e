"""Pure parts (no engine): request validation, admission/placement, audit log, demux."""

import asyncio
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ale.sandbox.admission import Admission, Capacity
from ale.sandbox.audit import AuditLog, read_audit
from ale.sandbox.backend import demux
from ale.sandbox.spec import BadRequest, OverCapacity, SandboxSpec, parse_hostport


def test_spec_defaults_are_secure():
  s = SandboxSpec.from_request({})
  assert (s.network, s.user, s.read_only, s.allow) == ("none", None, True, ())
  assert s.cpus == 1.0 and s.memory_mb == 512 and s.pids == 256


@pytest.mark.parametrize(
  "body, match",
  [
    ([], "JSON object"),
    ({"cpus": 0}, "cpus"),
    ({"cpus": True}, "cpus"),
    ({"memory_mb": 1.5}, "integer"),
    ({"pids": -1}, "pids"),
    ({"network": "bridge"}, "network"),
    ({"allow": ["a:1"]}, "allowlist"),
    ({"network": "allowlist", "allow": ["a:99999"]}, "host:port"),
    ({"env": {"1BAD": "x"}}, "env names"),
    ({"env": {"A": 1}}, "string to string"),
    ({"workdir": "rel"}, "absolute"),
    ({"read_only": "no"}, "read_only"),
    ({"image": ""}, "image"),
    ({"surprise": 1}, "surprise"),
  ],
)
def test_spec_rejects_bad_input(body, match):
  with pytest.raises(BadRequest, match=match):
    SandboxSpec.from_request(body)


@given(
  st.dictionaries(
    st.sampled_from(["cpus", "memory_mb", "pids", "disk_mb", "ttl_s", "image", "env"]),
    st.one_of(st.integers(), st.floats(), st.text(), st.none(), st.booleans()),
  )
)
def test_spec_validation_never_crashes(body):
  try:
    s = SandboxSpec.from_request(body)
  except BadRequest:
    return
  assert SandboxSpec.from_request(s.to_request()) == s


def test_parse_hostport():
  assert parse_hostport("Example.org:443") == ("example.org", 443)
  assert parse_hostport("10.0.0.1:80") == ("10.0.0.1", 80)
  for bad in ("x", "x:0", "x:70000", ":80", 5):
    with pytest.raises(BadRequest):
      parse_hostport(bad)


async def test_admission_places_by_free_capacity_and_waits():
  adm = Admission(
    [
      Capacity("a", cpus=4, memory_mb=4096, sandboxes=10),
      Capacity("b", cpus=2, memory_mb=4096, sandboxes=10),
    ]
  )
  assert (
    await adm.acquire(1, 512, 0) == "a"
  )  # a: 3/4 free vs b: 2/2 free -> b has larger fraction next
  assert await adm.acquire(1, 512, 0) == "b"
  assert await adm.acquire(1, 512, 0) == "a"
  assert await adm.acquire(1, 512, 0) in ("a", "b")
  with pytest.raises(OverCapacity, match="ever hold"):
    await adm.acquire(8, 512, 0)
  while True:
    try:
      await adm.acquire(1, 512, 0)
    except OverCapacity as e:
      assert e.status == 429 and e.retry_after >= 1
      break
  assert adm.rejected == 1
  waiter = asyncio.ensure_future(adm.acquire(1, 512, 5))
  await asyncio.sleep(0.05)
  assert not waiter.done()
  await adm.release("b", 1, 512)
  assert await asyncio.wait_for(waiter, 1) == "b"


def test_audit_log_appends_jsonl(tmp_path):
  p = tmp_path / "sub" / "audit.jsonl"
  log = AuditLog(p)
  log.record("create", id="sb-1")
  log.record("exec", id="sb-1", cmd=["a", "b"], exit_code=0)
  log.close()
  AuditLog(p).record("delete", id="sb-1")
  recs = read_audit(p)
  assert [r["event"] for r in recs] == ["create", "exec", "delete"]
  assert recs[1]["cmd"] == ["a", "b"] and all(isinstance(r["ts"], float) for r in recs)
  assert json.loads(p.read_text().splitlines()[0])["id"] == "sb-1"


def test_demux():
  frame = lambda k, b: bytes([k, 0, 0, 0]) + struct.pack(">I", len(b)) + b
  assert demux(frame(1, b"out") + frame(2, b"err") + frame(1, b"2")) == (b"out2", b"err")
