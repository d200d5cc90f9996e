"""Per-token log-probs from logits, without a lingering float32 `[B, T, V]` copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _lse_and_gather(logits: Array, tokens: Array) -> tuple[Array, Array]:
  # The float32 upcast is consumed by the reductions (XLA fuses it); nothing [B, T, V]
  # in float32 is materialised or kept.
  # The max is exact in the logits' own dtype; only the exp-sum reads them in float32.
  m = jnp.max(logits, axis=-1, keepdims=True).astype(jnp.float32)
  lse = jnp.log(jnp.sum(jnp.exp(logits.astype(jnp.float32) - m), axis=-1)) + m[..., 0]
  picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0].astype(jnp.float32)
  return lse, picked


@jax.custom_vjp
def _token_logprobs(logits: Array, tokens: Array) -> Array:
  lse, picked = _lse_and_gather(logits, tokens)
  return picked - lse


def _fwd(logits, tokens):
  lse, picked = _lse_and_gather(logits, tokens)
  # Residuals: the logits (alive anyway, in their own dtype) and lse `[B, T]` float32.
  return picked - lse, (logits, tokens, lse)


def _bwd(res, g):
  logits, tokens, lse = res
  # d/dlogits (x_y − lse) = onehot(y) − softmax(x); computed in one fused pass and
  # written straight out in the logits' dtype.
  probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
  onehot = jnp.arange(logits.shape[-1], dtype=tokens.dtype) == tokens[..., None]
  dlogits = (onehot.astype(jnp.float32) - probs) * g[..., None].astype(jnp.float32)
  return dlogits.astype(logits.dtype), None


_token_logprobs.defvjp(_fwd, _bwd)


def token_logprobs(logits: Array, tokens: Array) -> Array:
  """`log softmax(logits)[…, tokens]`: per-token log-probs, `[B, T]` float32.

  `logits[b, t]` must already be the distribution of `tokens[b, t]` (shift the model's
  outputs by one position before calling). The log-sum-exp is accumulated in float32
  from logits in any dtype; the backward pass recomputes the softmax from the saved
  logits and `lse [B, T]` instead of keeping a float32 `[B, T, V]` activation.

  Args:
    logits: `[..., V]` logits (e.g. `[B, T, V]` bfloat16).
    tokens: `[...]` integer token ids in [0, V).

  Returns:
    `[...]` float32 log-probs.
  """
  logits = jnp.asarray(logits)
  tokens = jnp.asarray(tokens)
  if logits.shape[:-1] != tokens.shape:
    raise ValueError(
      f"logits {logits.shape} and tokens {tokens.shape} disagree; expected logits "
      "[..., V] with tokens [...] (shift logits by one position first)"
    )
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be integer ids; got dtype {tokens.dtype}")
  return _token_logprobs(logits, tokens.astype(jnp.int32))
