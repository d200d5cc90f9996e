"""Mixture-of-experts routing and dropless expert dispatch.

Router (as in Hugging Face Qwen3-MoE): `p = softmax(x W_r)` over E experts in float32,
keep the top-k probabilities, renormalise them to sum 1 when `norm_topk_prob`.
Each expert is a SwiGLU MLP `down(silu(gate(x)) * up(x))`; a token's output is the
weighted sum of its k experts' outputs. Three dispatch implementations, identical in
value:

* `experts_ragged`: sort the N*k (token, expert) assignments by expert and run the
  grouped matmul `jax.lax.ragged_dot` (no capacity, nothing dropped).
* `experts_blocked`: sort the same way, pad each expert's group to a multiple of `m`
  rows and run one batched matmul over `[num_blocks, m, D] x [num_blocks, D, F]` with
  each block's expert weights gathered. Dropless too; the fast path on XLA:CPU, where
  `ragged_dot` is lowered to a dense masked matmul over all groups.
* `experts_dense`: every expert on every token, combined with a `[N, E]` matrix that is
  zero off the top-k (the simple reference).

Load-balancing statistics follow `transformers`' `load_balancing_loss_func`
(Switch-Transformer eq. 4-6): summed over MoE layers, then
`aux = E * sum_e (count_e / rows) * (prob_e / rows)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ale.models.sharding import constrain


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


def default_block_size(num_assignments: int, num_experts: int) -> int:
  """Largest power of two <= A / (4E), clipped to [1, 128]: padding <= 25% of A rows."""
  per = num_assignments / (4 * num_experts)
  if per < 1:
    return 1
  return int(min(128, 2 ** math.floor(math.log2(per))))


def experts_blocked(x, routing: Routing, w_gate, w_up, w_down, block_size: int | None = None):
  """Dropless dispatch as a block-sparse grouped matmul (sorted, block-padded groups).

  Each expert's group of rows is padded to a multiple of `m = block_size`; block b
  belongs to one expert `e_b`, and the three projections become batched matmuls
  `[nb, m, D] @ W[e_b]`. The static row count `nb*m >= N*k + E*(m-1)` covers every
  routing, so no token is ever dropped.
  """
  n, k = routing.experts.shape
  num_experts = w_gate.shape[0]
  a = n * k
  m = block_size or default_block_size(a, num_experts)
  nb = -(-(a + num_experts * (m - 1)) // m)
  nb = -(-nb // 8) * 8  # a multiple of 8 so blocks split over the batch mesh axes
  flat, order, group_sizes = _sort_by_expert(routing, num_experts)
  padded = ((group_sizes + m - 1) // m) * m
  padded_end = jnp.cumsum(padded)
  padded_start = padded_end - padded
  start = jnp.cumsum(group_sizes) - group_sizes
  sorted_e = flat[order]
  dest_sorted = padded_start[sorted_e] + jnp.arange(a, dtype=jnp.int32) - start[sorted_e]
  dest = jnp.zeros((a,), jnp.int32).at[order].set(dest_sorted)  # padded row of each assignment
  block_expert = jnp.searchsorted(padded_end, jnp.arange(nb) * m, side="right")
  block_expert = jnp.minimum(block_expert, num_experts - 1)  # trailing blocks: unused rows

  xp = jnp.zeros((nb * m, x.shape[-1]), x.dtype).at[dest].set(jnp.repeat(x, k, axis=0))
  # Under a mesh, blocks (and each block's gathered expert weights) split over the batch
  # axes, so a device holds only the weights of its own blocks.
  blk = ("batch", None, None)
  xp = constrain(xp.reshape(nb, m, -1), blk)
  wg, wu, wd = (constrain(w[block_expert], blk) for w in (w_gate, w_up, w_down))
  h = _swiglu(jnp.einsum("bmd,bdf->bmf", xp, wg), jnp.einsum("bmd,bdf->bmf", xp, wu))
  yp = constrain(jnp.einsum("bmf,bfd->bmd", constrain(h, blk), wd), blk).reshape(nb * m, -1)
  return _combine(yp[dest], routing, n, k)


def dispatch(impl: str, x, routing: Routing, w_gate, w_up, w_down, block_size: int | None = None):
  """Runs the experts with the named implementation ("auto", "ragged", "blocked", "dense")."""
  if impl == "auto":
    impl = "blocked" if jax.default_backend() == "cpu" else "ragged"
  if impl == "ragged":
    return experts_ragged(x, routing, w_gate, w_up, w_down)
  if impl == "blocked":
    return experts_blocked(x, routing, w_gate, w_up, w_down, block_size)
  if impl == "dense":
    return experts_dense(x, routing, w_gate, w_up, w_down)
  raise ValueError(f"unknown MoE implementation {impl!r}; expected auto, ragged, blocked or dense")
