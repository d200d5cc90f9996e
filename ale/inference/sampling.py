"""Token sampling as pure jitted functions, with the log-prob of what was sampled.

Rollout workers return, with every sampled token, its log-probability under the
distribution the token was actually drawn from (the behaviour policy μ of IPA, E6/E10),
and optionally under the raw model (temperature 1, no truncation).

The sampling distribution of one row (one slot) with logits `z` [V]:

  1. temperature  τ > 0:  z' = z / τ
  2. top-k        k > 0:  keep the k largest z' (ties broken by token id)
  3. top-p        p < 1:  keep the smallest prefix of the sorted tokens whose
                          probability mass (after top-k) reaches p (the first token
                          always stays)
  4. μ = softmax(z' masked to the kept tokens)

Greedy (τ == 0) takes argmax z. Its sampling distribution is a point mass, whose
log-prob (0) says nothing; greedy rows therefore report the raw model log-prob as
their sampling log-prob too (documented choice, used by the parity tests).

Randomness is per request: every slot carries its own PRNG key (from the request's
seed) and the key for the n-th sampled token is `fold_in(key, n)`, so a request's
tokens do not depend on which slot it lands in, what else is in the batch, or when
it arrived.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Paper evaluation defaults (Avg@3 protocol): temperature 0.7, top-p 0.8, top-k 20.
PAPER_TEMPERATURE = 0.7
PAPER_TOP_P = 0.8
PAPER_TOP_K = 20


def request_key(seed: int) -> jax.Array:
  """The raw uint32[2] PRNG key of a request with this seed (host-side helper)."""
  return jax.random.key_data(jax.random.key(seed % (2**63), impl="threefry2x32"))


def _sorted_sampling_logprobs(
  logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """`(order [B, V], log μ in that order [B, V])`: tokens by descending tempered logit."""
  logits = logits.astype(jnp.float32)
  _, vocab = logits.shape
  temp = jnp.where(temperature > 0, temperature, 1.0).astype(jnp.float32)
  scaled = logits / temp[:, None]
  # Descending order, ties by ascending token id (stable sort of the negation).
  order = jnp.argsort(-scaled, axis=-1, stable=True)  # [B, V]
  sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
  rank = jnp.arange(vocab)[None, :]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
  keep = rank < k[:, None]
  probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly better tokens
  top_p = top_p[:, None].astype(jnp.float32)
  keep &= (mass_before < top_p) | (top_p >= 1.0) | (rank == 0)
  return order, jax.nn.log_softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)


def sampling_logprobs(
  logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array
) -> jax.Array:
  """Log-probs of the sampling distribution μ for each row (−inf outside its support).

  Args:
    logits: `[B, V]` model logits (any float dtype; computed in float32).
    temperature: `[B]`; rows with temperature <= 0 use 1 (greedy rows; see module doc).
    top_p: `[B]` in (0, 1]; 1 disables.
    top_k: `[B]` int; <= 0 disables.

  Returns:
    `[B, V]` float32 log μ(v).
  """
  order, logp_sorted = _sorted_sampling_logprobs(logits, temperature, top_p, top_k)
  rows = jnp.arange(order.shape[0])[:, None]
  return jnp.zeros_like(logp_sorted).at[rows, order].set(logp_sorted)


def sample(
  logits: jax.Array,
  keys: jax.Array,
  steps: jax.Array,
  temperature: jax.Array,
  top_p: jax.Array,
  top_k: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Samples one token per row.

  Args:
    logits: `[B, V]`.
    keys: `[B, 2]` uint32 raw threefry keys, one per request.
    steps: `[B]` int32, index of the token being sampled within its request (the key is
      `fold_in(key, step)`).
    temperature, top_p, top_k: `[B]` per-row sampling parameters (see
      `sampling_logprobs`); temperature <= 0 means greedy.

  Returns:
    tokens `[B]` int32, sampling log-prob `[B]` float32 (log μ(token)), raw model
    log-prob `[B]` float32 (log softmax(logits)(token)).
  """
  logits = logits.astype(jnp.float32)
  is_greedy = temperature <= 0

  def stochastic(_):
    order, logp_sorted = _sorted_sampling_logprobs(logits, temperature, top_p, top_k)

    def draw(key_data, step, row_logp):
      key = jax.random.fold_in(jax.random.wrap_key_data(key_data, impl="threefry2x32"), step)
      return jax.random.categorical(key, row_logp)

    pick = jax.vmap(draw)(keys, steps, logp_sorted)[:, None]  # rank of the drawn token
    sampled = jnp.take_along_axis(order, pick, axis=-1)[:, 0]
    mu = jnp.take_along_axis(logp_sorted, pick, axis=-1)[:, 0]
    return sampled.astype(jnp.int32), mu

  def all_greedy(_):
    b = logits.shape[0]
    return jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.float32)

  # The vocab sort of the stochastic path is skipped when no row samples (greedy
  # decoding); rows' results do not depend on which branch ran.
  sampled, mu = jax.lax.cond(jnp.all(is_greedy), all_greedy, stochastic, None)
  tokens = jnp.where(is_greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
  raw = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, jnp.where(is_greedy, raw, mu), raw
