"""Sampling: the sampling distribution against a NumPy re-derivation, draws against it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.inference import sampling

_jit_logprobs = jax.jit(sampling.sampling_logprobs)
_sample = jax.jit(sampling.sample)


def keys(seeds):
  return jax.random.key_data(
    jax.vmap(lambda s: jax.random.key(s, impl="threefry2x32"))(jnp.asarray(seeds))
  )


def reference_logprobs(logits, temperature, top_p, top_k):
  """NumPy: temperature, then top-k, then top-p on the renormalised top-k mass."""
  z = np.asarray(logits, np.float64) / (temperature if temperature > 0 else 1.0)
  order = sorted(range(len(z)), key=lambda i: (-z[i], i))
  keep = order[:top_k] if top_k > 0 else order
  p = np.exp(z[keep] - z[keep].max())
  p /= p.sum()
  kept, mass = [], 0.0
  for tok, q in zip(keep, p, strict=True):
    if kept and top_p < 1 and mass >= top_p:
      break
    kept.append(tok)
    mass += q
  out = np.full(len(z), -np.inf)
  sub = z[kept] - z[kept].max()
  out[kept] = sub - np.log(np.exp(sub).sum())
  return out


@settings(max_examples=40, deadline=None)
@given(
  seed=st.integers(0, 2**31 - 1),
  temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.7]),
  top_p=st.sampled_from([0.05, 0.5, 0.8, 0.95, 1.0]),
  top_k=st.sampled_from([0, 1, 3, 20]),
)
def test_sampling_distribution_matches_numpy(seed, temperature, top_p, top_k):
  logits = np.random.default_rng(seed).normal(size=(1, 40)).astype(np.float32) * 3
  got = _jit_logprobs(
    jnp.asarray(logits), jnp.asarray([temperature]), jnp.asarray([top_p]), jnp.asarray([top_k])
  )[0]
  want = reference_logprobs(logits[0], temperature, top_p, top_k)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  fin = np.isfinite(want)
  np.testing.assert_allclose(np.asarray(got)[fin], want[fin], atol=1e-5)


def test_draws_follow_the_reported_distribution_and_stay_in_support():
  v, n = 12, 4000
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, v)) * 2, jnp.float32)
  rows = jnp.repeat(logits, n, axis=0)
  ks = keys(np.arange(n))
  t, p, k = jnp.full((n,), 0.7), jnp.full((n,), 0.8), jnp.full((n,), 5, jnp.int32)
  toks, logp, raw = _sample(rows, ks, jnp.zeros((n,), jnp.int32), t, p, k)
  mu = np.exp(reference_logprobs(np.asarray(logits[0]), 0.7, 0.8, 5))
  freq = np.bincount(np.asarray(toks), minlength=v) / n
  assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(mu))
  np.testing.assert_allclose(freq, mu, atol=0.03)
  np.testing.assert_allclose(np.exp(np.asarray(logp)), mu[np.asarray(toks)], rtol=1e-5)
  want_raw = jax.nn.log_softmax(logits[0])[toks]
  np.testing.assert_allclose(np.asarray(raw), np.asarray(want_raw), atol=1e-6)


def test_greedy_is_argmax_and_reports_raw_logprob():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 30)), jnp.float32)
  ks = keys([0, 1, 2])
  z = jnp.zeros((3,))
  toks, logp, raw = _sample(logits, ks, z.astype(jnp.int32), z, jnp.ones(3), z.astype(jnp.int32))
  np.testing.assert_array_equal(toks, jnp.argmax(logits, -1))
  np.testing.assert_allclose(logp, raw)
  np.testing.assert_allclose(raw, jnp.max(jax.nn.log_softmax(logits), -1), atol=1e-6)


def test_seed_and_step_decide_the_draw_not_the_row():
  logits = jnp.asarray(np.random.default_rng(2).normal(size=(1, 50)), jnp.float32)
  rows = jnp.repeat(logits, 4, axis=0)
  ks = keys([7, 8, 7, 7])
  steps = jnp.asarray([3, 3, 3, 4], jnp.int32)
  ones = jnp.ones((4,))
  toks, _, _ = _sample(rows, ks, steps, ones, ones, jnp.zeros((4,), jnp.int32))
  again, _, _ = _sample(rows[::-1], ks[::-1], steps[::-1], ones, ones, jnp.zeros((4,), jnp.int32))
  np.testing.assert_array_equal(toks, again[::-1])
  assert int(toks[0]) == int(toks[2])


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (0, 1e-6)])
def test_degenerate_truncation_is_greedy(top_k, top_p):
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(5, 30)), jnp.float32)
  ks = keys(np.arange(5))
  toks, logp, _ = _sample(
    logits,
    ks,
    jnp.zeros(5, jnp.int32),
    jnp.ones(5),
    jnp.full(5, top_p),
    jnp.full(5, top_k, jnp.int32),
  )
  np.testing.assert_array_equal(toks, jnp.argmax(logits, -1))
  np.testing.assert_allclose(logp, 0.0, atol=1e-6)
