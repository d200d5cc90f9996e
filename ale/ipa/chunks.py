"""Chunked MDP bookkeeping: chunk segmentation (E7), chunk returns (E8), segment sums.

A row of a batch is one packed trajectory (prompt, policy completions, observations,
padding). Policy tokens are split into interaction chunks c_0 … c_{K−1}; every other
token belongs to no chunk (id −1). Everything here is a pure function of `[B, T]`
arrays with cost linear in B·T: segmentation is one blocked prefix count, a per-chunk
reduction one `segment_sum` over row-offset chunk ids and one gather back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

LEVELS = ("token", "chunk", "sequence")


def segment_chunks(policy_mask: Array, turn_starts: Array | None = None) -> Array:
  """Chunk index of every token (E7): `[B, T]` int32, −1 where `policy_mask` is 0.

  A chunk is a maximal run of policy tokens (one LLM call's completion, ending in a
  tool call or in task completion); environment and observation tokens belong to no
  chunk. Where `turn_starts` is 1 a new chunk starts even inside a run, for packers
  that place two completions back to back. Chunks are numbered 0 … K−1 per row, left
  to right.

  Args:
    policy_mask: `[B, T]` bool/int, 1 on tokens the policy generated.
    turn_starts: optional `[B, T]` bool/int, 1 on the first token of each completion.

  Returns:
    `[B, T]` int32 chunk ids.
  """
  p = jnp.asarray(policy_mask).astype(bool)
  if p.ndim != 2:
    raise ValueError(f"policy_mask must be [B, T]; got shape {p.shape}")
  prev = jnp.pad(p[:, :-1], ((0, 0), (1, 0)))
  start = p & ~prev
  if turn_starts is not None:
    ts = jnp.asarray(turn_starts)
    if ts.shape != p.shape:
      raise ValueError(
        f"turn_starts has shape {ts.shape} but policy_mask has {p.shape}; pass one flag per token"
      )
    start = start | (p & ts.astype(bool))
  ids = count_cumsum(start) - 1
  return jnp.where(p, ids, -1)


def prefix_sums(x: Array, block: int = 32) -> Array:
  """Inclusive prefix sums along the last axis, float32, `[..., T]`.

  `jnp.cumsum` lowers to a slow windowed reduction on CPU; this blocked scan is ~10x
  faster and as cheap elsewhere: prefix sums inside blocks of `block` tokens are one
  matmul with a triangular 0/1 matrix (full float32 precision), and the block
  offsets the same scan, recursively, over the T/block block totals. Exact for 0/1
  inputs below 2^24.
  """
  x = jnp.asarray(x, jnp.float32)
  *lead, t = x.shape
  hi = jax.lax.Precision.HIGHEST
  if t <= block:
    return jnp.matmul(x, jnp.triu(jnp.ones((t, t), jnp.float32)), precision=hi)
  nb = -(-t // block)
  pad = [(0, 0)] * len(lead) + [(0, nb * block - t)]
  xb = jnp.pad(x, pad).reshape(*lead, nb, block)
  within = jnp.matmul(xb, jnp.triu(jnp.ones((block, block), jnp.float32)), precision=hi)
  totals = within[..., -1]
  offsets = prefix_sums(totals, block) - totals
  return (within + offsets[..., None]).reshape(*lead, nb * block)[..., :t]


def count_cumsum(flags: Array) -> Array:
  """Inclusive running count of `flags` along axis 1, `[B, T]` int32 (exact)."""
  return prefix_sums(jnp.asarray(flags).astype(jnp.float32)).astype(jnp.int32)


def num_chunks(chunk_ids: Array) -> Array:
  """Number of chunks K per row, `[B]` int32 (chunk ids are 0 … K−1, −1 off-chunk)."""
  # A float max: XLA:CPU lowers an int32 max-reduce to a slow reduce-window tree.
  return jnp.max(jnp.asarray(chunk_ids).astype(jnp.float32), axis=1).astype(jnp.int32) + 1


def chunk_steps_to_end(chunk_ids: Array, steps_to_end: Array | None = None) -> Array:
  """Per-token distance Δ from a token's chunk to the trajectory's last chunk, `[B, T]`.

  Without `steps_to_end` the row holds the whole trajectory, so chunk k of K has
  Δ = K − 1 − k (the last chunk gets 0). `steps_to_end` replaces it when a row holds
  only part of a trajectory (e.g. one row per LLM call after context compression):
  `[B, T]` is read per token, `[B, C]` (C ≠ T) per chunk (chunk k reads column k; ids
  beyond C − 1 read the last column), `[B]` is one value per row. Off-chunk tokens get 0.
  """
  c = jnp.asarray(chunk_ids)
  on = c >= 0
  if steps_to_end is None:
    delta = num_chunks(c)[:, None] - 1 - c
  else:
    s = steps_to_end_2d(steps_to_end, c.shape[0])
    if s.shape == c.shape:
      delta = s
    else:
      idx = jnp.clip(c, 0, s.shape[1] - 1)
      delta = jnp.take_along_axis(s, idx, axis=1)
  return jnp.where(on, delta, 0)


def steps_to_end_2d(steps_to_end: Array, batch: int) -> Array:
  """`steps_to_end` as a 2-D array: `[B, T]` per token, `[B, C]` per chunk, or `[B, 1]`
  from `[B]` per row; raises on any other shape."""
  s = jnp.asarray(steps_to_end)
  if s.ndim == 1:
    s = s[:, None]
  if s.ndim != 2 or s.shape[0] != batch:
    raise ValueError(
      f"steps_to_end has shape {jnp.shape(steps_to_end)}; expected [B, T] per token, "
      f"[B, C] per chunk or [B] per row with B = {batch}"
    )
  return s


def chunk_returns(
  chunk_ids: Array,
  advantages: Array,
  gamma: float | Array,
  steps_to_end: Array | None = None,
) -> Array:
  """Chunk-level discounted return (E8): `G_k = γ^(K−1−k) · A_b` on the tokens of chunk k.

  All tokens of a chunk share its return; the last chunk gets the undiscounted
  advantage; tokens in no chunk get 0. `steps_to_end` (see `chunk_steps_to_end`)
  replaces `K − 1 − k` when a row holds only part of a trajectory.

  Args:
    chunk_ids: `[B, T]` int chunk ids (from `segment_chunks`), −1 off-chunk.
    advantages: `[B]` per-row final reward / advantage R.
    gamma: discount per chunk, in (0, 1].
    steps_to_end: optional distances to the last chunk, `[B, T]`, `[B, C]` or `[B]`.

  Returns:
    `[B, T]` float32 returns.
  """
  c = jnp.asarray(chunk_ids)
  a = jnp.asarray(advantages, jnp.float32)
  if a.shape != c.shape[:1]:
    raise ValueError(f"advantages must be [B] = [{c.shape[0]}]; got shape {a.shape}")
  disc = discounts(c, gamma, steps_to_end)
  return jnp.where(c >= 0, disc * a[:, None], 0.0)


def discounts(chunk_ids: Array, gamma: float | Array, steps_to_end: Array | None = None) -> Array:
  """`γ^Δ` per token (E8), `[B, T]` float32, with Δ from `chunk_steps_to_end`."""
  delta = chunk_steps_to_end(chunk_ids, steps_to_end).astype(jnp.float32)
  if isinstance(gamma, (int, float)) and gamma == 1.0:
    return jnp.ones_like(delta)
  return jnp.exp(delta * jnp.log(jnp.asarray(gamma, jnp.float32)))


def chunk_space_sums(
  values: list[Array], chunk_ids: Array, mask: Array, with_count: bool = True
) -> tuple[list[Array], Array | None, Array]:
  """Per-chunk sums of `[B, T]` values in chunk space: `out[b, k]` = Σ over chunk k of row b.

  Only tokens where `mask` is 1 and the chunk id is ≥ 0 are summed; chunk ids may be
  any numbers in [0, T) (chunks need not be contiguous). One `segment_sum` per value
  over row-offset ids `b·T + chunk_id`: linear in B·T whatever the number of chunks.
  Off-mask tokens get an out-of-range id and are dropped.

  Returns the `[B, T]` sums (column k = chunk k), the `[B, T]` per-chunk counts of
  summed tokens (None unless `with_count`), and the flat ids `[B·T]` that gather chunk-space values back to
  tokens (−1 tokens read chunk 0).
  """
  c = jnp.asarray(chunk_ids).astype(jnp.int32)
  b, t = c.shape
  n = b * t
  m = jnp.asarray(mask).astype(bool) & (c >= 0)
  gid = jnp.arange(b, dtype=jnp.int32)[:, None] * t + jnp.clip(c, 0, t - 1)
  sid = jnp.where(m, gid, n).reshape(-1)
  channels = [*values, m.astype(jnp.float32)] if with_count else list(values)
  flat = [jnp.asarray(v, jnp.float32).reshape(-1) for v in channels]
  sums = [s.reshape(b, t) for s in _segment_sums(flat, sid, n)]
  if with_count:
    return sums[:-1], sums[-1], gid.reshape(-1)
  return sums, None, gid.reshape(-1)


def _pack_pairs() -> bool:
  # On CPU a scatter-add is bound by the latency of back-to-back adds into the same
  # chunk's address, so two float32 channels riding in one complex64 scatter (or
  # gather) cost about one; the sums are bit-identical (complex adds are two float
  # adds). Elsewhere plain float32 ops are used.
  return jax.default_backend() == "cpu"


def _segment_sums(flat: list[Array], ids: Array, n: int) -> list[Array]:
  """`segment_sum` of each `[N]` float32 channel over `ids` (out-of-range ids dropped)."""
  if not _pack_pairs():
    return [jax.ops.segment_sum(v, ids, num_segments=n) for v in flat]
  out = []
  for i in range(0, len(flat), 2):
    if i + 1 < len(flat):
      z = jax.ops.segment_sum(jax.lax.complex(flat[i], flat[i + 1]), ids, num_segments=n)
      out += [jnp.real(z), jnp.imag(z)]
    else:
      out.append(jax.ops.segment_sum(flat[i], ids, num_segments=n))
  return out


def to_tokens(chunk_values: list[Array], gid: Array) -> list[Array]:
  """Gather `[B, T]` chunk-space values back to tokens with `chunk_space_sums`' ids."""
  shape = chunk_values[0].shape
  flat = [v.reshape(-1) for v in chunk_values]
  if not _pack_pairs():
    return [v[gid].reshape(shape) for v in flat]
  out = []
  for i in range(0, len(flat), 2):
    if i + 1 < len(flat):
      z = jax.lax.complex(flat[i], flat[i + 1])[gid].reshape(shape)
      out += [jnp.real(z), jnp.imag(z)]
    else:
      out.append(flat[i][gid].reshape(shape))
  return out


def chunk_sums(values: list[Array], chunk_ids: Array, mask: Array) -> list[Array]:
  """Sum of each `[B, T]` value over its token's chunk, broadcast back to `[B, T]`.

  Only tokens where `mask` is 1 are summed; tokens with chunk id −1 read chunk 0's sum
  (callers mask them out).
  """
  sums, _, gid = chunk_space_sums(values, chunk_ids, mask, with_count=False)
  return to_tokens(sums, gid)


def level_sums(
  level: str, values: list[Array], mask: Array, chunk_ids: Array | None
) -> list[Array]:
  """Sum of each value over the token's unit at `level`, broadcast to `[B, T]`.

  "token": the token itself; "chunk": its chunk (E7); "sequence": its row. Only tokens
  where `mask` is 1 are summed.
  """
  if level == "token":
    return [jnp.where(mask, v, 0) for v in values]
  if level == "sequence":
    return [
      jnp.broadcast_to(jnp.sum(jnp.where(mask, v, 0), axis=1, keepdims=True), v.shape)
      for v in values
    ]
  if level == "chunk":
    if chunk_ids is None:
      raise ValueError("chunk level needs chunk_ids; compute them with segment_chunks")
    return chunk_sums(values, chunk_ids, mask)
  raise ValueError(f"unknown level {level!r}; expected one of {LEVELS}")
