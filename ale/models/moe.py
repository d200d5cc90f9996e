"""Mixture-of-experts routing and dropless expert dispatch.

Router (as in Hugging Face Qwen3-MoE): `p = softmax(x W_r)` over E experts in float32,
keep the top-k probabilities, renormalise them to sum 1 when `norm_topk_prob`.
Each expert is a SwiGLU MLP `down(silu(gate(x)) * up(x))`; a token's output is the
weighted sum of its k experts' outputs. Dispatch implementations, identical in
value:

* `experts_ragged`: sort the N*k (token, expert) assignments by expert and run the
  grouped matmul `jax.lax.ragged_dot` (no capacity, nothing dropped).
* `experts_blocked`: sort the same way, pad each expert's group to a multiple of `m`
  rows and run one batched matmul over `[num_blocks, m, D] x [num_blocks, D, F]` with
  each block's expert weights gathered. Dropless too; the fast path on XLA:CPU, where
  `ragged_dot` is lowered to a dense masked matmul over all groups.
* `experts_bucketed`: sort the same way, place every expert's group in an `[E, C, D]`
  layout at one capacity `C` (a static ladder, the rung picked per step by
  `lax.switch`) and run batched matmuls against the expert weights as they are (no
  weight copies). Dropless; fast when the router is balanced.
* `experts_dense`: every expert on every token, combined with a `[N, E]` matrix that is
  zero off the top-k (the simple reference).
* `experts_gather`: each assignment gathers its own expert's weights (no sort); for
  decode-sized token counts (N*k well below E). "auto" chooses by backend and token
  count (`auto_impl`).

Under a mesh (`jax.set_mesh`), `moe_block_sharded` runs the router and the dispatch per
data shard inside `jax.shard_map` (local sort, no global scatter; expert weights
gathered over the batch axes, split over `tensor`), which keeps the dispatch
temporaries proportional to the local token count.

Load-balancing statistics follow `transformers`' `load_balancing_loss_func`
(Switch-Transformer eq. 4-6): summed over MoE layers, then
`aux = E * sum_e (count_e / rows) * (prob_e / rows)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ale.models.sharding import _ACTIVE_RULES, constrain, logical_to_spec


class Routing(NamedTuple):
  """Top-k routing for N tokens: `weights [N, k]` (x dtype), `experts [N, k]` int32."""

  weights: jax.Array
  experts: jax.Array
  probs: jax.Array  # [N, E] float32 softmax of the router logits


class RouterStats(NamedTuple):
  """Per-layer sums for the auxiliary loss: `counts [E]`, `probs [E]`, `rows []`."""

  counts: jax.Array
  probs: jax.Array
  rows: jax.Array

  @staticmethod
  def zeros(num_experts: int) -> RouterStats:
    z = jnp.zeros((num_experts,), jnp.float32)
    return RouterStats(z, z, jnp.zeros((), jnp.float32))

  def __add__(self, other: RouterStats) -> RouterStats:  # type: ignore[override]
    return RouterStats(self.counts + other.counts, self.probs + other.probs, self.rows + other.rows)


def route(logits: jax.Array, k: int, norm_topk_prob: bool, dtype) -> Routing:
  """Softmax router with top-k. `logits [N, E]` -> Routing."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  top_p, top_i = jax.lax.top_k(probs, k)
  if norm_topk_prob:
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
  return Routing(top_p.astype(dtype), top_i.astype(jnp.int32), probs)


def router_stats(routing: Routing, num_experts: int, valid: jax.Array | None) -> RouterStats:
  """Sums of top-k assignment counts and router probabilities over valid tokens."""
  n = routing.probs.shape[0]
  w = jnp.ones((n,), jnp.float32) if valid is None else valid.astype(jnp.float32)
  onehot = jax.nn.one_hot(routing.experts, num_experts, dtype=jnp.float32)  # [N, k, E]
  counts = jnp.einsum("nke,n->e", onehot, w)
  probs = jnp.einsum("ne,n->e", routing.probs, w)
  return RouterStats(counts, probs, jnp.sum(w))


def aux_loss_from_stats(stats: RouterStats, num_experts: int) -> jax.Array:
  """`E * sum_e f_e * P_e` with f, P averaged over all MoE-layer rows (HF convention)."""
  rows = jnp.maximum(stats.rows, 1.0)
  return num_experts * jnp.sum((stats.counts / rows) * (stats.probs / rows))


def _swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
  return jax.nn.silu(gate) * up


def experts_dense(x, routing: Routing, w_gate, w_up, w_down):
  """Reference: all experts on all tokens. `x [N, D]`, `w_gate/w_up [E, D, F]`, `w_down [E, F, D]`."""
  num_experts = w_gate.shape[0]
  combine = jnp.einsum(
    "nk,nke->ne", routing.weights, jax.nn.one_hot(routing.experts, num_experts, dtype=x.dtype)
  )
  h = _swiglu(jnp.einsum("nd,edf->nef", x, w_gate), jnp.einsum("nd,edf->nef", x, w_up))
  y = jnp.einsum("nef,efd->ned", h, w_down)
  return jnp.einsum("ned,ne->nd", y, combine)


def _sort_by_expert(routing: Routing, num_experts: int):
  """Order of the N*k assignments by expert (stable), and each expert's group size."""
  flat = routing.experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return flat, order, group_sizes


def _combine(y_assign, routing: Routing, n: int, k: int):
  """`y_assign [N*k, D]` in (token, slot) order -> weighted sum over slots `[N, D]`."""
  y = y_assign.reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", y, routing.weights.astype(y.dtype))


def experts_ragged(x, routing: Routing, w_gate, w_up, w_down):
  """Dropless dispatch with `jax.lax.ragged_dot` over expert-sorted token groups."""
  n, k = routing.experts.shape
  num_experts = w_gate.shape[0]
  _, order, group_sizes = _sort_by_expert(routing, num_experts)
  xs = x[order // k]  # [N*k, D], grouped by expert
  h = _swiglu(
    jax.lax.ragged_dot(xs, w_gate, group_sizes), jax.lax.ragged_dot(xs, w_up, group_sizes)
  )
  ys = jax.lax.ragged_dot(h, w_down, group_sizes)  # [N*k, D]
  inverse = jnp.argsort(order)  # sorted row of each (token, slot) assignment
  return _combine(ys[inverse], routing, n, k)


def default_block_size(num_assignments: int, num_experts: int, ffn: int = 128) -> int:
  """Block rows for `experts_blocked`: the largest power of two <= A / E, in [1, cap],
  `cap` = max(128, the largest power of two <= the expert width `ffn`).

  About one block per expert on average. Every block copies its expert's weights
  (`[D, F]` three times) and the static row count is `A + E*(m-1)`, so small blocks
  cost weight copies and big ones cost padded rows; one block per expert balances the
  two (measured on the `small` preset: training, A=2048, E=16 -> m=128 is fastest; a
  32-slot decode step, A=64 -> m=4 halves the step time against one-row blocks). The
  cap grows with the expert width so a block's rows stay comparable to the weights it
  copies (qwen3-30b-a3b: F=768 -> blocks of up to 512 rows).
  """
  per = num_assignments / max(num_experts, 1)
  if per < 2:
    return 1
  cap = max(128, 2 ** math.floor(math.log2(max(ffn, 1))))
  return int(min(cap, 2 ** math.floor(math.log2(per))))


def _vary_like(a: jax.Array, *others: jax.Array) -> jax.Array:
  """Inside `shard_map`: marks `a` as varying over the manual axes `others` vary over, so
  a custom VJP's cotangent (which varies over them) has the type of its primal input.
  Outside `shard_map` this is the identity."""
  vma = lambda v: set(jax.typeof(v).manual_axis_type.varying)  # noqa: E731
  want = set().union(*(vma(o) for o in others)) - vma(a)
  return jax.lax.pcast(a, tuple(sorted(want)), to="varying") if want else a


@jax.custom_vjp
def _take_rows_vjp(a, fwd_idx, bwd_idx):
  return jnp.take(a, fwd_idx, axis=0, mode="fill", fill_value=0)


def _take_rows_fwd(a, fwd_idx, bwd_idx):
  return _take_rows_vjp(a, fwd_idx, bwd_idx), (fwd_idx, bwd_idx)


def _take_rows_bwd(res, g):
  fwd_idx, bwd_idx = res
  return jnp.take(g, bwd_idx, axis=0, mode="fill", fill_value=0), None, None


_take_rows_vjp.defvjp(_take_rows_fwd, _take_rows_bwd)


def _take_rows(a: jax.Array, fwd_idx: jax.Array, bwd_idx: jax.Array) -> jax.Array:
  """`out[p] = a[fwd_idx[p]]` (0 where `fwd_idx[p] == len(a)`), for a row bijection.

  `fwd_idx [P]` and `bwd_idx [R]` are inverse maps between the rows of `a [R, D]` and
  the used rows of `out [P, D]` (unused rows of `out` point past `a`). The gradient is
  then also a gather, `da[r] = dout[bwd_idx[r]]`, instead of the scatter-add XLA would
  emit for the transpose of a gather (slow on XLA:CPU).
  """
  return _take_rows_vjp(_vary_like(a, fwd_idx, bwd_idx), fwd_idx, bwd_idx)


@jax.custom_vjp
def _take_experts_vjp(w, block_expert):
  return jnp.take(w, block_expert, axis=0)


def _take_experts_fwd(w, block_expert):
  return _take_experts_vjp(w, block_expert), (block_expert, w.shape[0])


def _take_experts_bwd(res, g):
  block_expert, num_experts = res
  onehot = jax.nn.one_hot(block_expert, num_experts, dtype=g.dtype)  # [nb, E]
  gw = jnp.einsum("be,bx->ex", onehot, g.reshape(g.shape[0], -1))
  return gw.reshape((num_experts,) + g.shape[1:]), None


_take_experts_vjp.defvjp(_take_experts_fwd, _take_experts_bwd)


def _take_experts(w: jax.Array, block_expert: jax.Array) -> jax.Array:
  """`w[block_expert]` (`[E, ...]` -> `[nb, ...]`); the gradient sums each expert's blocks
  with a one-hot matmul instead of a scatter-add (faster on XLA:CPU)."""
  return _take_experts_vjp(_vary_like(w, block_expert), block_expert)


def experts_blocked(x, routing: Routing, w_gate, w_up, w_down, block_size: int | None = None):
  """Dropless dispatch as a block-sparse grouped matmul (sorted, block-padded groups).

  Each expert's group of rows is padded to a multiple of `m = block_size`; block b
  belongs to one expert `e_b`, and the three projections become batched matmuls
  `[nb, m, D] @ W[e_b]`. The static row count `nb*m >= N*k + E*(m-1)` covers every
  routing, so no token is ever dropped. Rows move between token order and block
  order by gathers only (`_take_rows`), in the forward and the backward pass.
  """
  n, k = routing.experts.shape
  num_experts = w_gate.shape[0]
  a = n * k
  m = block_size or default_block_size(a, num_experts, w_gate.shape[-1])
  nb = -(-(a + num_experts * (m - 1)) // m)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is not None and not mesh.empty and not mesh.manual_axes:
    nb = -(-nb // 8) * 8  # a multiple of 8 so blocks split over the batch mesh axes
  rows = nb * m
  flat, order, group_sizes = _sort_by_expert(routing, num_experts)
  padded = ((group_sizes + m - 1) // m) * m
  padded_end = jnp.cumsum(padded)
  padded_start = padded_end - padded
  start = jnp.cumsum(group_sizes) - group_sizes
  sorted_e = flat[order]
  dest_sorted = padded_start[sorted_e] + jnp.arange(a, dtype=jnp.int32) - start[sorted_e]
  # dest[i]: padded row of assignment i (token-major); src[p]: assignment of padded row p
  # (a = none: a padding row).
  dest = jnp.zeros((a,), jnp.int32).at[order].set(dest_sorted, unique_indices=True)
  src = (
    jnp.full((rows,), a, jnp.int32)
    .at[dest_sorted]
    .set(order.astype(jnp.int32), unique_indices=True)
  )
  block_expert = jnp.searchsorted(padded_end, jnp.arange(nb) * m, side="right")
  block_expert = jnp.minimum(block_expert, num_experts - 1)  # trailing blocks: unused rows

  xa = jnp.broadcast_to(x[:, None, :], (n, k, x.shape[-1])).reshape(a, -1)  # token-major
  xp = _take_rows(xa, src, dest)
  # Under a mesh, blocks (and each block's gathered expert weights) split over the batch
  # axes, so a device holds only the weights of its own blocks.
  blk = ("batch", None, None)
  xp = constrain(xp.reshape(nb, m, -1), blk)
  # At training sizes (>= 128 rows per expert) gate and up run as one matmul against
  # their concatenation `[E, D, 2F]`: one weight gather and one (twice as wide) batched
  # matmul instead of two, forward and backward. Below that (decode steps, prefills)
  # the concatenation's copy of all experts' weights costs more than it saves (a
  # 32-slot decode step of the `small` preset: 8.2 vs 12.1 ms).
  f = w_gate.shape[-1]
  if a >= 128 * num_experts:
    w_gu = jnp.concatenate([w_gate, w_up], axis=-1)
    wgu, wd = (constrain(_take_experts(w, block_expert), blk) for w in (w_gu, w_down))
    gu = jnp.einsum("bmd,bdf->bmf", xp, wgu)
    h = _swiglu(gu[..., :f], gu[..., f:])
  else:
    wg, wu, wd = (constrain(_take_experts(w, block_expert), blk) for w in (w_gate, w_up, w_down))
    h = _swiglu(jnp.einsum("bmd,bdf->bmf", xp, wg), jnp.einsum("bmd,bdf->bmf", xp, wu))
  yp = constrain(jnp.einsum("bmf,bfd->bmd", constrain(h, blk), wd), blk).reshape(rows, -1)
  return _combine(_take_rows(yp, dest, src), routing, n, k)


_CAPACITY_STEPS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)


def capacity_levels(num_assignments: int, num_tokens: int, num_experts: int) -> tuple[int, ...]:
  """Static per-expert capacities of `experts_bucketed`, ascending, the last `num_tokens`.

  A ladder over the mean group size `A / E` (x 1, 1.25, 1.5, 2, 3, 4, 6, 8, ...), rounded
  up to a multiple of 8 and capped at `num_tokens` (top-k experts are distinct, so no
  expert ever gets more than one row per token): a balanced router lands on a rung 1.25x
  above the mean; any routing at all has a rung that holds it.
  """
  mean = max(num_assignments / max(num_experts, 1), 1.0)
  levels = {min(num_tokens, -(-math.ceil(mean * f) // 8) * 8) for f in _CAPACITY_STEPS}
  return tuple(sorted(levels | {num_tokens}))


def _bucket_layout(group_sizes, start, cap: int, num_experts: int, a: int):
  """Capacity layout `[E * cap]` -> sorted assignment row (`a` = empty slot)."""
  j = jnp.arange(cap, dtype=jnp.int32)[None, :]
  src = jnp.where(j < group_sizes[:, None], start[:, None] + j, a)
  return src.reshape(num_experts * cap)


def _bucketed_branches(levels, num_experts: int, a: int):
  """One forward and one backward function per capacity level (for `lax.switch`)."""

  def fwd_at(cap):
    def fwd(xs, slot_e, rank, group_sizes, start, wg, wu, wd):
      src = _bucket_layout(group_sizes, start, cap, num_experts, a)
      slot = slot_e * cap + rank  # capacity slot of each sorted row
      xc = jnp.take(xs, src, axis=0, mode="fill", fill_value=0).reshape(num_experts, cap, -1)
      gate = jnp.einsum("ecd,edf->ecf", xc, wg)
      up = jnp.einsum("ecd,edf->ecf", xc, wu)
      yc = jnp.einsum("ecf,efd->ecd", _swiglu(gate, up), wd)
      f = gate.shape[-1]
      back = lambda t: jnp.take(t.reshape(num_experts * cap, -1), slot, axis=0, mode="clip")  # noqa: E731
      return back(yc), back(gate).reshape(a, f), back(up).reshape(a, f)

    return fwd

  def bwd_at(cap):
    def bwd(xs, gate_s, up_s, dys, slot_e, rank, group_sizes, start, wg, wu, wd):
      src = _bucket_layout(group_sizes, start, cap, num_experts, a)
      slot = slot_e * cap + rank
      to_c = lambda t: jnp.take(t, src, axis=0, mode="fill", fill_value=0).reshape(  # noqa: E731
        num_experts, cap, -1
      )
      back = lambda t: jnp.take(t.reshape(num_experts * cap, -1), slot, axis=0, mode="clip")  # noqa: E731
      sig = jax.nn.sigmoid(gate_s)
      act = gate_s * sig  # silu(gate)
      dyc = to_c(dys)
      dwd = jnp.einsum("ecf,ecd->efd", to_c(act * up_s), dyc)
      dh = back(jnp.einsum("ecd,efd->ecf", dyc, wd))  # [A, F]
      dup = dh * act
      dgate = dh * up_s * sig * (1 + gate_s * (1 - sig))
      xc, dgc, duc = to_c(xs), to_c(dgate), to_c(dup)
      dwg = jnp.einsum("ecd,ecf->edf", xc, dgc)
      dwu = jnp.einsum("ecd,ecf->edf", xc, duc)
      dxc = jnp.einsum("ecf,edf->ecd", dgc, wg) + jnp.einsum("ecf,edf->ecd", duc, wu)
      return back(dxc), dwg, dwu, dwd

    return bwd

  return [fwd_at(c) for c in levels], [bwd_at(c) for c in levels]


def _grouped_swiglu(xs, slot_e, rank, group_sizes, start, w_gate, w_up, w_down, levels):
  """SwiGLU experts over expert-sorted rows `xs [A, D]` (row i belongs to expert
  `slot_e[i]`, the `rank[i]`-th of its group), at the smallest capacity in `levels`
  that holds the largest group (`lax.switch`, so only that rung runs). Custom VJP: the
  residuals are fixed-size `[A, F]` sorted-row tensors whatever rung ran."""
  num_experts, a = w_gate.shape[0], xs.shape[0]
  fwds, bwds = _bucketed_branches(levels, num_experts, a)
  ints = (slot_e, rank, group_sizes, start)

  def pick():
    return jnp.searchsorted(jnp.asarray(levels, jnp.int32), jnp.max(group_sizes), side="left")

  @jax.custom_vjp
  def run(xs, wg, wu, wd):
    return jax.lax.switch(pick(), fwds, xs, *ints, wg, wu, wd)[0]

  def run_fwd(xs, wg, wu, wd):
    ys, gate_s, up_s = jax.lax.switch(pick(), fwds, xs, *ints, wg, wu, wd)
    return ys, (xs, gate_s, up_s, wg, wu, wd)

  def run_bwd(res, dys):
    xs, gate_s, up_s, wg, wu, wd = res
    return jax.lax.switch(pick(), bwds, xs, gate_s, up_s, dys, *ints, wg, wu, wd)

  run.defvjp(run_fwd, run_bwd)
  return run(xs, w_gate, w_up, w_down)


def experts_bucketed(x, routing: Routing, w_gate, w_up, w_down):
  """Dropless dispatch as a dense batched matmul over a per-expert capacity, with no
  weight copies: for balanced routers on XLA:CPU.

  Assignments are sorted by expert and placed in an `[E, C, D]` layout, every expert
  padded to the capacity `C`; the three projections are batched matmuls against the
  expert weights as they are (`[E, D, F]`, nothing gathered), and the weight gradients
  come out in that shape too. `C` is the smallest rung of `capacity_levels` that holds
  the largest group this step (a `lax.switch` over static shapes): ~1.25x the mean for
  a balanced router, and `N` (every token) at worst, so nothing is ever dropped.

  Its cost follows the LARGEST group, where "blocked" follows the sum of the groups, so
  it wins when the load is balanced (one `small`-preset block, fwd+bwd, near-uniform
  router: 19 vs 24 ms) and loses when it is not (a randomly initialised model routes up
  to 3.6x the mean to one expert: the whole model is then ~15% slower than with
  "blocked"). "auto" therefore keeps "blocked" on CPU; choose "bucketed" for a router
  trained towards balance (the load-balancing loss).
  """
  n, k = routing.experts.shape
  num_experts = w_gate.shape[0]
  a = n * k
  flat, order, group_sizes = _sort_by_expert(routing, num_experts)
  start = jnp.cumsum(group_sizes) - group_sizes
  sorted_e = flat[order].astype(jnp.int32)
  rank = jnp.arange(a, dtype=jnp.int32) - start[sorted_e]
  inverse = jnp.zeros((a,), jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32))
  xa = jnp.broadcast_to(x[:, None, :], (n, k, x.shape[-1])).reshape(a, -1)  # token-major
  xs = _take_rows(xa, order.astype(jnp.int32), inverse)
  levels = capacity_levels(a, n, num_experts)
  ys = _grouped_swiglu(xs, sorted_e, rank, group_sizes, start, w_gate, w_up, w_down, levels)
  return _combine(_take_rows(ys, inverse, order.astype(jnp.int32)), routing, n, k)


def experts_gather(x, routing: Routing, w_gate, w_up, w_down):
  """Decode-sized dispatch: every (token, slot) assignment gathers its own expert's
  weights (`[N*k, D, F]`) and runs one batched matrix-vector product per projection.

  Reads only the N*k selected experts' weights (a batch-1 decode step of the `small`
  preset touches 2 of 16 experts) and needs no sort, so it wins when N*k is well below E.
  """
  n, k = routing.experts.shape
  e = routing.experts.reshape(-1)
  xa = jnp.broadcast_to(x[:, None, :], (n, k, x.shape[-1])).reshape(n * k, -1)
  g = jnp.einsum("ad,adf->af", xa, jnp.take(w_gate, e, axis=0))
  u = jnp.einsum("ad,adf->af", xa, jnp.take(w_up, e, axis=0))
  y = jnp.einsum("af,afd->ad", _swiglu(g, u), jnp.take(w_down, e, axis=0))
  return _combine(y, routing, n, k)


# Token-count threshold of the "auto" choice on XLA:CPU, measured on the `small` preset
# (E=16, k=2; whole decode steps, benchmarks/inference.py): per-assignment weight
# gathers while 8*N*k <= E (a batch-1 decode step: 1.0 vs 1.2 ms), the blocked dispatch
# above (batch 2: 0.9 vs 1.2 ms; batch 8: 2.9 vs 4.4 ms for all experts dense).
def auto_impl(num_tokens: int, k: int, num_experts: int, backend: str | None = None) -> str:
  """The implementation "auto" runs for `num_tokens` tokens (static under jit)."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return "ragged"
  if 8 * num_tokens * k <= num_experts:
    return "gather"
  return "blocked"


def dispatch(impl: str, x, routing: Routing, w_gate, w_up, w_down, block_size: int | None = None):
  """Runs the experts with the named implementation ("auto", "ragged", "blocked",
  "bucketed", "dense", or the decode-sized "gather"). "auto" picks by backend and token count (`auto_impl`)."""
  if impl == "auto":
    impl = auto_impl(x.shape[0], routing.experts.shape[1], w_gate.shape[0])
  if impl == "gather":
    return experts_gather(x, routing, w_gate, w_up, w_down)
  if impl == "ragged":
    return experts_ragged(x, routing, w_gate, w_up, w_down)
  if impl == "blocked":
    return experts_blocked(x, routing, w_gate, w_up, w_down, block_size)
  if impl == "bucketed":
    return experts_bucketed(x, routing, w_gate, w_up, w_down)
  if impl == "dense":
    return experts_dense(x, routing, w_gate, w_up, w_down)
  raise ValueError(
    f"unknown MoE implementation {impl!r}; expected auto, ragged, blocked, bucketed, dense or gather"
  )


def moe_block(x, valid, w_router, w_gate, w_up, w_down, *, cfg, impl: str):
  """Router + experts for `x [N, D]`: `(y [N, D], RouterStats)`.

  `valid [N]` (or None) masks padding tokens out of the load-balancing statistics.
  """
  routing = route(x @ w_router, cfg.num_experts_per_tok, cfg.norm_topk_prob, x.dtype)
  y = dispatch(impl, x, routing, w_gate, w_up, w_down, cfg.moe_block_size)
  return y, router_stats(routing, cfg.num_experts, valid)


class ShardPlan(NamedTuple):
  """How `moe_block_sharded` splits one MoE block over the active mesh."""

  mesh: object
  batch_axes: tuple[str, ...]  # mesh axes the tokens are split over (manual in shard_map)
  ffn_axes: tuple[str, ...]  # mesh axes the expert width F stays split over (psum'd)


def shard_plan(x_shape, w_shape) -> ShardPlan | None:
  """A per-data-shard plan for the active mesh (`jax.set_mesh`), or None for the plain path.

  The tokens' mesh axes come from the logical rule of "batch" (shape-aware); the expert
  width keeps the mesh axes of "moe_mlp" that are not batch axes (tensor parallelism).
  None when no mesh is set or the tokens are not split (e.g. a decode step whose token
  count the batch axes do not divide).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.manual_axes:
    return None
  rules = _ACTIVE_RULES[-1]
  spec = logical_to_spec(("batch", None), rules, mesh, x_shape)[0]
  batch = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  if not batch:
    return None
  wspec = logical_to_spec(("expert", "embed", "moe_mlp"), rules, mesh, w_shape)[2]
  ffn = () if wspec is None else (wspec,) if isinstance(wspec, str) else tuple(wspec)
  ffn = tuple(a for a in ffn if a not in batch and w_shape[2] % mesh.shape[a] == 0)
  return ShardPlan(mesh, batch, ffn)


def moe_block_sharded(plan: ShardPlan, x, valid, w_router, w_gate, w_up, w_down, *, cfg, impl):
  """`moe_block` with the dispatch run per data shard under `jax.shard_map`.

  Each shard routes, sorts and dispatches only its own tokens (so the sort/scatter
  temporaries scale with the local, not the global, token count); the expert weights
  enter the shard_map gathered over the batch axes (GSPMD inserts the all-gather of the
  `expert`/`fsdp` shards, FSDP-style, one layer at a time) and stay split over the
  `plan.ffn_axes` (tensor parallelism: gate/up by columns, down by rows, outputs psum'd).
  The router statistics are psum'd over the batch axes. Equal to the unsharded block.
  No all-to-all, so it runs on XLA:CPU (where `ragged_all_to_all` is not implemented).
  """
  P = jax.sharding.PartitionSpec
  bt = plan.batch_axes
  tok = P(bt, None)
  ffn = plan.ffn_axes or None
  has_valid = valid is not None

  def local(x, valid, wr, wg, wu, wd):
    y, stats = moe_block(x, valid if has_valid else None, wr, wg, wu, wd, cfg=cfg, impl=impl)
    if plan.ffn_axes:
      y = jax.lax.psum(y, plan.ffn_axes)
    stats = RouterStats(*(jax.lax.psum(s, bt) for s in stats))
    return y, stats

  vin = valid if has_valid else jnp.ones(x.shape[:1], bool)
  fn = jax.shard_map(
    local,
    mesh=plan.mesh,
    in_specs=(tok, P(bt), P(), P(None, None, ffn), P(None, None, ffn), P(None, ffn, None)),
    out_specs=(tok, RouterStats(P(), P(), P())),
  )
  return fn(x, vin, w_router, w_gate, w_up, w_down)
