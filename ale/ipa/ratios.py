"""Importance ratios (E4, E9) and train/infer mismatch masks (E6, E10) at any level.

A ratio at level ℓ ∈ {token, chunk, sequence} compares two per-token log-probs over
the tokens of one unit u (a token, a chunk, a row):

  geometric: r_u = (Π_{t∈u} p(t)/q(t))^(1/|u|) = exp(mean_{t∈u} (log p − log q))
  product:   r_u =  Π_{t∈u} p(t)/q(t)          = exp(sum_{t∈u}  (log p − log q))

and is broadcast to every token of u. Off-mask tokens get ratio 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ale.ipa.chunks import chunk_space_sums, level_sums, segment_chunks, to_tokens

Array = jax.Array

RATIO_MODES = ("geometric", "product")


def _check_mode(mode: str) -> None:
  if mode not in RATIO_MODES:
    raise ValueError(f"unknown ratio mode {mode!r}; expected one of {RATIO_MODES}")


def level_log_ratios(
  level: str,
  mode: str,
  log_diffs: list[Array],
  mask: Array,
  chunk_ids: Array | None,
) -> list[Array]:
  """Aggregated log-ratios `log r_u` of each `[B, T]` log-difference at `level`.

  All differences share one token count, so a chunk-level geometric ratio and mask
  together cost three segment sums. Returns `[B, T]` float32, 0 off-mask (ratio 1).
  """
  _check_mode(mode)
  mask = jnp.asarray(mask).astype(bool)
  diffs = [jnp.asarray(d, jnp.float32) for d in log_diffs]
  if level == "token":
    return [jnp.where(mask, d, 0.0) for d in diffs]
  geometric = mode == "geometric"
  if level == "chunk":
    if chunk_ids is None:
      raise ValueError("chunk level needs chunk_ids; compute them with segment_chunks")
    # Reduce in chunk space, divide there, gather each mean back once.
    sums, count, gid = chunk_space_sums(diffs, chunk_ids, mask, with_count=geometric)
    if geometric:
      sums = [s / jnp.maximum(count, 1.0) for s in sums]
    return [jnp.where(mask, s, 0.0) for s in to_tokens(sums, gid)]
  values = diffs + ([mask.astype(jnp.float32)] if geometric else [])
  sums = level_sums(level, values, mask, chunk_ids)
  if geometric:
    count = jnp.maximum(sums[-1], 1.0)
    sums = [s / count for s in sums[:-1]]
  return [jnp.where(mask, s, 0.0) for s in sums]


def importance_ratios(
  logp: Array,
  old_logp: Array,
  policy_mask: Array,
  chunk_ids: Array | None = None,
  *,
  level: str = "chunk",
  mode: str = "geometric",
) -> Array:
  """Importance ratio π_θ/π_θold per token, unit or row (E4 sequence, E9 chunk).

  Args:
    logp: `[B, T]` current policy log-probs log π_θ(τ_t).
    old_logp: `[B, T]` log-probs of the trainer at the old weights, log π_θold(τ_t).
    policy_mask: `[B, T]` 1 on policy tokens (the only ones aggregated).
    chunk_ids: `[B, T]` chunk ids; computed with `segment_chunks(policy_mask)` if None.
    level: "token", "chunk" or "sequence".
    mode: "geometric" (E4/E9, length-normalised) or "product".

  Returns:
    `[B, T]` float32 ratio of each token's unit; 1 off policy tokens.
  """
  if level == "chunk" and chunk_ids is None:
    chunk_ids = segment_chunks(policy_mask)
  (lr,) = level_log_ratios(
    level, mode, [jnp.asarray(logp) - jnp.asarray(old_logp)], policy_mask, chunk_ids
  )
  return jnp.exp(lr)


def chunk_ratios(logp: Array, old_logp: Array, chunk_ids: Array, mode: str = "geometric") -> Array:
  """Chunk importance ratio (E9) `ρ_c = (Π_{t∈c} π_θ(t)/π_θold(t))^(1/|c|)`, `[B, T]`.

  Every token of chunk c carries ρ_c; tokens in no chunk (id −1) carry 1.
  """
  c = jnp.asarray(chunk_ids)
  return importance_ratios(logp, old_logp, c >= 0, c, level="chunk", mode=mode)


def keep_mask(ratio: Array, threshold: float | None, band: tuple[float, float] | None) -> Array:
  """`1[ratio ≤ H]` (E6/E10) and, with a band (lo, hi), `1[lo ≤ ratio ≤ hi]`; bool."""
  keep = jnp.ones(jnp.shape(ratio), bool)
  if threshold is not None:
    keep = keep & (ratio <= threshold)
  if band is not None:
    lo, hi = band
    keep = keep & (ratio >= lo) & (ratio <= hi)
  return keep


def mismatch_mask(
  old_logp: Array,
  behavior_logp: Array,
  policy_mask: Array,
  chunk_ids: Array | None = None,
  *,
  level: str = "chunk",
  threshold: float | None = None,
  band: tuple[float, float] | None = None,
  mode: str = "geometric",
) -> Array:
  """Train/infer mismatch mask: token level E6, chunk level E10, or one per row.

  With r_u the `mode` ratio π_θold/μ_θold over unit u (the trainer's old log-probs
  against the sampler's), a policy token is kept when `r_u ≤ threshold` (H) and, when
  `band=(lo, hi)` is given, `lo ≤ r_u ≤ hi` (the two-sided variant). With neither,
  every policy token is kept.

  Returns:
    `[B, T]` float32: 1 = kept, 0 = masked or not a policy token.
  """
  p = jnp.asarray(policy_mask).astype(bool)
  if level == "chunk" and chunk_ids is None:
    chunk_ids = segment_chunks(p)
  (lr,) = level_log_ratios(
    level, mode, [jnp.asarray(old_logp) - jnp.asarray(behavior_logp)], p, chunk_ids
  )
  return (p & keep_mask(jnp.exp(lr), threshold, band)).astype(jnp.float32)
