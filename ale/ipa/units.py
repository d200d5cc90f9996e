"""Unit spaces: where per-unit quantities (ratios, masks, returns) of one level live.

A level ℓ ∈ {token, chunk, sequence} groups a row's tokens into units (E4/E6 tokens,
E7–E10 chunks, E4 rows). A unit space holds one entry per unit (or per piece of a unit)
as a `[B, U]` array, so that exps, clips and masks run once per unit instead of once
per token, and then broadcasts the entries back to the `[B, T]` tokens:

- `TokenUnits`: U = T, one entry per token (the identity).
- `RowUnits`: U = 1, one entry per row.
- `SubBlockChunkUnits`: U = ⌈T/16⌉, one entry per sub-block of 16 tokens, valid when no
  sub-block holds tokens of two chunks (`sub_block_layout`'s `fits`). A chunk's total is
  the sum of its sub-blocks' partial sums (a small segment sum over B·T/16 entries), and
  every sub-block carries its chunk's total; broadcasting back is a repeat, not a gather.
  This is the fast path on CPU, where a scatter-add over B·T tokens into a few addresses
  is latency bound.
- `ScatterChunkUnits`: U = T, entry k = chunk k (one `segment_sum` over all tokens and a
  gather back); valid for any chunk layout, the fallback when `fits` is false.

`reduce(values, mask)` gives each unit's totals of the masked values and of the mask
(the token count), every entry holding its unit's totals, plus each entry's own
(local) count: Σ_entries local·f(entry) = Σ_{masked tokens} f(unit of the token), which
is how metrics average over tokens in unit space.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ale.ipa.chunks import _segment_sums, chunk_space_sums, num_chunks, steps_to_end_2d, to_tokens

Array = jax.Array

SUB_BLOCK = 16


def _pad_blocks(x: Array, size: int, fill) -> Array:
  """`[B, T]` → `[B, ⌈T/size⌉, size]`, padding the tail with `fill`."""
  b, t = x.shape
  n = -(-t // size)
  return jnp.pad(x, ((0, 0), (0, n * size - t)), constant_values=fill).reshape(b, n, size)


def sub_block_layout(chunk_ids: Array, size: int = SUB_BLOCK) -> tuple[Array, Array]:
  """Chunk id of every sub-block of `size` tokens, and whether no sub-block is mixed.

  Returns (`[B, ⌈T/size⌉]` int32: the largest chunk id in the sub-block, −1 when it holds
  no chunk token; scalar bool `fits`: every chunk token of a sub-block has that id, and
  every id is below ⌈T/size⌉). Chunks need not be contiguous: sub-blocks are grouped by
  id, as the scatter path groups tokens. `segment_chunks` ids always satisfy the bound
  when no sub-block is mixed (each chunk then owns at least one sub-block).
  """
  cb = _pad_blocks(jnp.asarray(chunk_ids).astype(jnp.int32), size, -1)
  # Max and min over the `size` strided columns: one fused elementwise loop (a reduce
  # over a short minor axis is several times slower on XLA:CPU).
  big = jnp.int32(2**31 - 1)
  sb = cb[:, :, 0]
  lo = jnp.where(sb >= 0, sb, big)
  for g in range(1, size):
    v = cb[:, :, g]
    sb = jnp.maximum(sb, v)
    lo = jnp.minimum(lo, jnp.where(v >= 0, v, big))
  # Chunk k is entry k of the per-row segment sum over sub-blocks, so ids must be < n.
  fits = jnp.all(((sb < 0) | (sb == lo)) & (sb < sb.shape[1]))
  return sb, fits


def _block_sums(values: list[Array], size: int) -> list[Array]:
  """Sums of each `[B, T]` value over sub-blocks of `size` tokens, `[B, ⌈T/size⌉]`.

  One `[N, size] @ [size, 1]` matmul over the stacked values (a reduce over a short
  minor axis is several times slower on XLA:CPU); full float32 precision.
  """
  b, t = values[0].shape
  n = -(-t // size)
  if n * size != t:
    values = [jnp.pad(v, ((0, 0), (0, n * size - t))) for v in values]
  # Stack first, then view as [C·B·n, size]: XLA:CPU runs this form several times
  # faster than a [.., n, size] reshape per value or one matmul per value.
  x = jnp.stack(values).reshape(-1, size)
  ones = jnp.ones((size, 1), jnp.float32)
  s = jnp.matmul(x, ones, precision=jax.lax.Precision.HIGHEST)
  return list(s.reshape(len(values), b, n))


def _masked(values: list[Array], mask: Array) -> list[Array]:
  return [jnp.where(mask, jnp.asarray(v, jnp.float32), 0.0) for v in values] + [
    mask.astype(jnp.float32)
  ]


class TokenUnits:
  """One entry per token: `reduce` masks, `to_tokens` is the identity."""

  level = "token"

  def __init__(self, shape: tuple[int, int]):
    self.shape = shape

  def reduce(self, values: list[Array], mask: Array) -> tuple[list[Array], Array]:
    sums = _masked(values, mask)
    return sums, sums[-1]

  def to_tokens(self, u: Array) -> Array:
    return jnp.broadcast_to(u, self.shape)


class RowUnits:
  """One entry per row (the sequence level, E4)."""

  level = "sequence"

  def __init__(self, shape: tuple[int, int]):
    self.shape = shape

  def reduce(self, values: list[Array], mask: Array) -> tuple[list[Array], Array]:
    sums = [jnp.sum(v, axis=1, keepdims=True) for v in _masked(values, mask)]
    return sums, sums[-1]

  def to_tokens(self, u: Array) -> Array:
    return jnp.broadcast_to(u, self.shape)


class SubBlockChunkUnits:
  """Chunk level (E7–E10) on sub-blocks of `size` tokens; needs `fits` (see module doc)."""

  level = "chunk"

  def __init__(self, chunk_ids: Array, sb: Array, size: int = SUB_BLOCK):
    self.shape = tuple(jnp.shape(chunk_ids))
    self.size = size
    self.unit_chunk_ids = sb
    b, n = sb.shape
    self._n = n
    # Row-offset chunk ids; off-chunk sub-blocks get an out-of-range id (dropped).
    row = jnp.arange(b, dtype=jnp.int32)[:, None] * n
    self._sid = jnp.where(sb >= 0, row + jnp.clip(sb, 0, n - 1), b * n).reshape(-1)
    self._gid = (row + jnp.clip(sb, 0, n - 1)).reshape(-1)
    self._on = jnp.asarray(chunk_ids) >= 0

  def num_chunks(self) -> Array:
    return num_chunks(self.unit_chunk_ids)

  def reduce(self, values: list[Array], mask: Array) -> tuple[list[Array], Array]:
    local = _block_sums(_masked(values, mask & self._on), self.size)
    b, n = local[0].shape
    flat = [v.reshape(-1) for v in local]
    totals = _segment_sums(flat, self._sid, b * n)
    totals = to_tokens([v.reshape(b, n) for v in totals], self._gid)
    return totals, local[-1]

  def to_tokens(self, u: Array) -> Array:
    b, t = self.shape
    u = jnp.broadcast_to(u, (b, self._n))
    return jnp.broadcast_to(u[:, :, None], (b, self._n, self.size)).reshape(b, -1)[:, :t]


class ScatterChunkUnits:
  """Chunk level for any chunk layout: entry k of a row is chunk k (U = T)."""

  level = "chunk"

  def __init__(self, chunk_ids: Array):
    c = jnp.asarray(chunk_ids).astype(jnp.int32)
    self.shape = tuple(c.shape)
    self._c = c
    self._k = num_chunks(c)
    b, t = c.shape
    self._gid = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + jnp.clip(c, 0, t - 1)).reshape(-1)
    k = jnp.arange(c.shape[1], dtype=jnp.int32)[None, :]
    self.unit_chunk_ids = jnp.where(k < self._k[:, None], k, -1)

  def num_chunks(self) -> Array:
    return self._k

  def reduce(self, values: list[Array], mask: Array) -> tuple[list[Array], Array]:
    vals = [jnp.asarray(v, jnp.float32) for v in values]
    sums, count, _ = chunk_space_sums(vals, self._c, mask, with_count=True)
    return [*sums, count], count

  def to_tokens(self, u: Array) -> Array:
    u = jnp.broadcast_to(u, self.shape)
    (out,) = to_tokens([u], self._gid)
    return out


def unit_deltas(
  unit_chunk_ids: Array, k: Array, steps_to_end: Array | None, t: int
) -> Array | None:
  """Δ (E8's K−1−k, or `steps_to_end`) per chunk-unit entry, `[B, U]`; None when
  `steps_to_end` is per token (`[B, T]`), which only the token space can hold."""
  ids = unit_chunk_ids
  if steps_to_end is None:
    delta = k[:, None] - 1 - ids
  else:
    s = steps_to_end_2d(steps_to_end, ids.shape[0])
    if s.shape[1] == t and t != 1:
      return None
    if s.shape[1] == 1:
      delta = jnp.broadcast_to(s, ids.shape)
    else:
      delta = jnp.take_along_axis(s, jnp.clip(ids, 0, s.shape[1] - 1), axis=1)
  return jnp.where(ids >= 0, delta, 0)
