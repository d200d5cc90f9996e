"""ipa_loss on an 8-device CPU mesh, batch sharded on a data axis, equals the unsharded run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ale import ipa
from tests.ipa.batches import random_batch


@pytest.fixture(scope="module")
def mesh():
  if jax.device_count() < 8:
    pytest.fail("expected 8 CPU devices (tests/conftest.py sets XLA_FLAGS)", pytrace=False)
  return Mesh(np.array(jax.devices()[:8]), ("data",))


@pytest.mark.parametrize(
  "cfg",
  [
    ipa.IPAConfig(granularity="chunk", gamma=0.9, mismatch_threshold=2.0),
    ipa.IPAConfig(granularity="token", mismatch_band=(0.5, 2.0), normalize="sequence"),
    ipa.IPAConfig(granularity="sequence", il_policy_weight="geometric"),
  ],
  ids=["chunk", "token", "sequence"],
)
def test_sharded_batch_matches_unsharded(mesh, cfg):
  logp, raw = random_batch(np.random.default_rng(0), 16, 48, il=True)
  batch = ipa.Batch(**{k: jnp.asarray(v) for k, v in raw.items()})
  fn = jax.value_and_grad(lambda lp, b: ipa.ipa_loss(lp, b, cfg), has_aux=True)
  (loss, metrics), grad = jax.jit(fn)(jnp.asarray(logp), batch)

  rows = NamedSharding(mesh, P("data"))
  s_logp = jax.device_put(jnp.asarray(logp), rows)
  s_batch = jax.device_put(batch, rows)  # every leaf is [B] or [B, T]: rows split over data
  assert len(s_logp.sharding.device_set) == 8
  (s_loss, s_metrics), s_grad = jax.jit(fn)(s_logp, s_batch)
  assert s_grad.sharding.is_equivalent_to(rows, 2)
  np.testing.assert_allclose(float(s_loss), float(loss), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(s_grad), np.asarray(grad), rtol=1e-5, atol=1e-9)
  for k in metrics:
    np.testing.assert_allclose(float(s_metrics[k]), float(metrics[k]), rtol=1e-5, atol=1e-7)


def test_sharded_sft_loss(mesh):
  rng = np.random.default_rng(1)
  logp = jnp.asarray(rng.normal(-1, 0.5, (16, 32)), jnp.float32)
  pm = jnp.asarray(rng.random((16, 32)) < 0.6)
  tid = jnp.asarray(np.sort(rng.integers(-1, 4, (16, 32)), axis=1), jnp.int32)
  tmask = jnp.asarray(rng.random((16, 4)) < 0.7, jnp.float32)
  f = jax.jit(lambda *a: ipa.sft_loss(*a)[0])
  want = f(logp, pm, tid, tmask)
  rows = NamedSharding(mesh, P("data"))
  got = f(*(jax.device_put(x, rows) for x in (logp, pm, tid, tmask)))
  np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
