"""Hypothesis properties of the IPA pieces (fixed shapes, so each jit compiles once)."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ale import ipa

B, T = 4, 16
SETTINGS = settings(max_examples=25, deadline=None)

masks = hnp.arrays(np.bool_, (B, T))
logps = hnp.arrays(np.float32, (B, T), elements=st.floats(-6.0, 0.0, width=32))
nonzero_adv = hnp.arrays(
  np.float32, (B,), elements=st.floats(0.125, 3.0, width=32) | st.floats(-3.0, -0.125, width=32)
)
advs = hnp.arrays(np.float32, (B,), elements=st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]))

SEGMENT = jax.jit(ipa.segment_chunks)
RETURNS = jax.jit(lambda pm, a, g: ipa.chunk_returns(ipa.segment_chunks(pm), a, g))
RATIOS = jax.jit(ipa.importance_ratios, static_argnames=("level", "mode"))
WEIGHTS = jax.jit(ipa.ipa_weights, static_argnums=2)
LOSS = jax.jit(ipa.ipa_loss, static_argnums=2)


@SETTINGS
@given(pm=masks, adv=nonzero_adv, gamma=st.floats(0.05, 0.99))
def test_returns_shrink_with_distance(pm, adv, gamma):
  g = np.abs(np.asarray(RETURNS(pm, adv, np.float32(gamma))))
  ids = np.asarray(SEGMENT(pm))
  for b in range(B):
    K = ids[b].max() + 1
    per_chunk = [g[b, ids[b] == k] for k in range(K)]
    for k in range(K):
      assert np.all(per_chunk[k] == per_chunk[k][0])  # one return per chunk
      if k + 1 < K:
        assert per_chunk[k][0] < per_chunk[k + 1][0]  # farther from the end: smaller
    if K:
      np.testing.assert_allclose(per_chunk[-1][0], abs(adv[b]), rtol=1e-6)


@SETTINGS
@given(
  pm=masks,
  logp=logps,
  level=st.sampled_from(["token", "chunk", "sequence"]),
  mode=st.sampled_from(["geometric", "product"]),
  adv=advs,
)
def test_ratio_is_one_on_policy(pm, logp, level, mode, adv):
  r = np.asarray(RATIOS(logp, logp, pm, level=level, mode=mode))
  assert np.all(r == 1.0)
  cfg = ipa.IPAConfig(granularity=level, ratio=mode, topr=False)
  batch = ipa.Batch(policy_mask=pm, advantages=adv, old_logp=logp, behavior_logp=logp)
  _, m = LOSS(logp, batch, cfg)
  assert float(m["clip_fraction"]) == 0.0
  if pm.any():
    assert float(m["ratio_mean"]) == 1.0 and float(m["ratio_max"]) == 1.0
  # on policy, TIS on every row equals the plain REINFORCE weights (A · return)
  w = np.asarray(WEIGHTS(logp, batch, cfg))
  np.testing.assert_allclose(w, np.where(pm, adv[:, None], 0.0), rtol=1e-6)


@SETTINGS
@given(
  pm=masks,
  logp=logps,
  old=logps,
  beh=logps,
  adv=advs,
  level=st.sampled_from(["token", "chunk", "sequence"]),
  rule=st.sampled_from([dict(mismatch_threshold=1.5), dict(mismatch_band=(0.5, 2.0))]),
)
def test_masking_only_removes_tokens(pm, logp, old, beh, adv, level, rule):
  batch = ipa.Batch(policy_mask=pm, advantages=adv, old_logp=old, behavior_logp=beh)
  base = ipa.IPAConfig(granularity=level, gamma=0.9)
  masked = ipa.IPAConfig(granularity=level, gamma=0.9, **rule)
  w0 = np.asarray(WEIGHTS(logp, batch, base))
  w1 = np.asarray(WEIGHTS(logp, batch, masked))
  assert np.all((w1 == w0) | (w1 == 0.0))
  assert np.all(w1[~pm] == 0.0)


@SETTINGS
@given(pm=masks, logp=logps, old=logps, beh=logps, adv=advs)
def test_one_token_chunks_equal_token_level(pm, logp, old, beh, adv):
  """Chunks of one token (a turn start on every token) reduce IPA to the token level."""
  ids = SEGMENT(pm, np.ones_like(pm))
  kw = dict(gamma=1.0, mismatch_threshold=1.5)
  b_chunk = ipa.Batch(policy_mask=pm, advantages=adv, old_logp=old, behavior_logp=beh,
                      chunk_ids=ids)  # fmt: skip
  b_token = ipa.Batch(policy_mask=pm, advantages=adv, old_logp=old, behavior_logp=beh)
  w_chunk = WEIGHTS(logp, b_chunk, ipa.IPAConfig(granularity="chunk", **kw))
  w_token = WEIGHTS(logp, b_token, ipa.IPAConfig(granularity="token", **kw))
  np.testing.assert_allclose(np.asarray(w_chunk), np.asarray(w_token), rtol=1e-6)


@SETTINGS
@given(pm=masks, ts=masks)
def test_segment_chunks_invariants(pm, ts):
  ids = np.asarray(SEGMENT(pm, ts))
  assert np.all((ids >= 0) == pm)
  for b in range(B):
    on = ids[b][pm[b]]
    if on.size:
      assert on[0] == 0 and np.all(np.diff(on) >= 0) and np.all(np.diff(on) <= 1)
  assert np.all(np.asarray(ipa.num_chunks(jnp.asarray(ids))) == ids.max(1) + 1)
