"""IPA loss (E3–E12), its token/sequence baselines, and the masked SFT loss (E1–E2).

The losses are model-agnostic: they take the current policy's per-token log-probs
`logp [B, T]` and a `Batch` of arrays, and return a scalar surrogate whose gradient is
the paper's policy gradient. Every weight (returns, ratios, masks) is a stop-gradient
constant, so `d loss / d logp_t = −w_t · s_b` with `s_b` the normalisation (1/N for
`normalize="token"`, N the number of policy tokens in the batch).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ale.ipa import units
from ale.ipa.chunks import LEVELS, discounts, num_chunks, segment_chunks
from ale.ipa.ratios import RATIO_MODES, keep_mask

Array = jax.Array

NORMALIZE = ("token", "sequence", "none")
IL_POLICY_WEIGHTS = (None, "product", "geometric")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IPAConfig:
  """Static configuration of `ipa_loss` (frozen and hashable: a valid static jit arg).

  Attributes:
    granularity: "chunk" (IPA, E8–E11), "token" or "sequence" (the baselines). Sets the
      return, ratio and mask levels together; each can be overridden below.
    return_level: level of the return. "chunk": E8 `γ^(K−1−k)·A` shared by a chunk;
      "token" and "sequence": the undiscounted advantage A on every token.
    ratio_level: level of the importance ratio π_θ/π_θold (E9 chunk, E4 sequence).
    mask_level: level of the mismatch mask π_θold/μ_θold (E6 token, E10 chunk).
    gamma: chunk discount γ ∈ (0, 1] (E8). The paper gives no value; 1 = no discount.
    mismatch_threshold: H of E6/E10: keep a unit when its mismatch ratio ≤ H. None: off.
    mismatch_band: optional (lo, hi): keep a unit only when lo ≤ ratio ≤ hi (two-sided).
    topr: True: clipped IS only on rows with advantage ≤ 0, a plain weighted-SL update
      on rows with advantage > 0 (E5, TOPR); False: clipped IS on every row (TIS).
    ratio: "geometric" (E4/E9) or "product" (the plain Π of token ratios).
    mismatch_ratio: "geometric" (E10) or "product", for the mismatch ratio.
    ratio_clip: (lo, hi) clip of the IS weight, `[ρ]_0^1` by default; None: no IS weight.
    lambda_rl: λ_RL of E12, the weight of the chunk-RL term.
    lambda_il: λ_IL of E12, the weight of the imitation term on `il_mask` tokens.
    il_policy_weight: E12's optional π_θ(c*_k) factor on the IL term: None/False (off),
      "product" or True (π_θ of the unit), "geometric" (its per-token geometric mean).
    normalize: "token" (divide by the batch's policy-token count N), "sequence" (mean
      over tokens within a row, then over non-empty rows) or "none" (plain sum).
  """

  granularity: str = "chunk"
  return_level: str | None = None
  ratio_level: str | None = None
  mask_level: str | None = None
  gamma: float = 1.0
  mismatch_threshold: float | None = None
  mismatch_band: tuple[float, float] | None = None
  topr: bool = True
  ratio: str = "geometric"
  mismatch_ratio: str = "geometric"
  ratio_clip: tuple[float, float] | None = (0.0, 1.0)
  lambda_rl: float = 1.0
  lambda_il: float = 1.0
  il_policy_weight: bool | str | None = None
  normalize: str = "token"

  def __post_init__(self):
    def fail(msg: str):
      raise ValueError(f"IPAConfig: {msg}")

    for name in ("granularity", "return_level", "ratio_level", "mask_level"):
      v = getattr(self, name)
      if (v is not None or name == "granularity") and v not in LEVELS:
        fail(f"{name}={v!r} is not a level; use one of {LEVELS}")
    if not 0.0 < float(self.gamma) <= 1.0:
      fail(f"gamma={self.gamma} must be in (0, 1]")
    if self.mismatch_threshold is not None and not float(self.mismatch_threshold) > 0:
      fail(f"mismatch_threshold={self.mismatch_threshold} must be > 0 (or None to disable)")
    for name in ("mismatch_band", "ratio_clip"):
      v = getattr(self, name)
      if v is None:
        continue
      try:
        lo, hi = (float(x) for x in v)
      except (TypeError, ValueError):
        fail(f"{name}={v!r} must be a pair (lo, hi) of numbers or None")
      if not lo <= hi:
        fail(f"{name}={v!r} needs lo <= hi")
      object.__setattr__(self, name, (lo, hi))
    for name in ("ratio", "mismatch_ratio"):
      if getattr(self, name) not in RATIO_MODES:
        fail(f"{name}={getattr(self, name)!r}; use one of {RATIO_MODES}")
    if self.normalize not in NORMALIZE:
      fail(f"normalize={self.normalize!r}; use one of {NORMALIZE}")
    ilw = {True: "product", False: None}.get(self.il_policy_weight, self.il_policy_weight)
    if ilw not in IL_POLICY_WEIGHTS:
      fail(f"il_policy_weight={self.il_policy_weight!r}; use False, True, 'product' or 'geometric'")
    object.__setattr__(self, "il_policy_weight", ilw)
    for name in ("gamma", "lambda_rl", "lambda_il"):
      object.__setattr__(self, name, float(getattr(self, name)))
    if self.mismatch_threshold is not None:
      object.__setattr__(self, "mismatch_threshold", float(self.mismatch_threshold))

  @property
  def levels(self) -> tuple[str, str, str]:
    """(return_level, ratio_level, mask_level) after applying `granularity`."""
    g = self.granularity
    return (self.return_level or g, self.ratio_level or g, self.mask_level or g)

  @property
  def masking(self) -> bool:
    return self.mismatch_threshold is not None or self.mismatch_band is not None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
  """Arrays of a packed training batch (a pytree; None fields are empty subtrees).

  Attributes:
    policy_mask: `[B, T]` 1 on tokens the policy generated (the loss's tokens).
    advantages: `[B]` per-row final reward / advantage R(τ); rows with R > 0 are T⁺.
    old_logp: `[B, T]` log π_θold: the trainer's log-probs at the sampling weights.
    behavior_logp: `[B, T]` log μ_θold: the inference engine's log-probs of the sample.
    chunk_ids: `[B, T]` chunk ids (−1 off-chunk); None: `segment_chunks(policy_mask)`.
    il_mask: `[B, T]` 1 on expert-prefix policy tokens (E12 imitation term); None: none.
    steps_to_end: distances to the trajectory's last chunk, `[B, T]` per token, `[B, C]`
      per chunk or `[B]` per row, for rows that hold part of a trajectory; None: K−1−k.
    expert_reward: `[B]` R of the expert trajectory for the IL returns G_{c*_k}; None: 1.
  """

  policy_mask: Array
  advantages: Array
  old_logp: Array
  behavior_logp: Array
  chunk_ids: Array | None = None
  il_mask: Array | None = None
  steps_to_end: Array | None = None
  expert_reward: Array | None = None


def _check_batch(logp: Array, batch: Batch) -> None:
  shape = jnp.shape(logp)
  if len(shape) != 2:
    raise ValueError(f"logp must be [B, T]; got shape {shape}")
  for name in ("policy_mask", "old_logp", "behavior_logp", "chunk_ids", "il_mask"):
    v = getattr(batch, name)
    if v is not None and jnp.shape(v) != shape:
      raise ValueError(f"batch.{name} has shape {jnp.shape(v)}; expected logp's shape {shape}")
  for name in ("advantages", "expert_reward"):
    v = getattr(batch, name)
    if v is not None and jnp.shape(v) != shape[:1]:
      raise ValueError(f"batch.{name} has shape {jnp.shape(v)}; expected [B] = [{shape[0]}]")


def _normalizer(p: Array, normalize: str) -> Array:
  """Per-row scale s_b `[B, 1]` so that the loss is −Σ w_t s_b logp_t."""
  pf = p.astype(jnp.float32)
  if normalize == "token":
    return jnp.broadcast_to(1.0 / jnp.maximum(jnp.sum(pf), 1.0), (p.shape[0], 1))
  if normalize == "sequence":
    n_b = jnp.sum(pf, axis=1, keepdims=True)
    rows = jnp.maximum(jnp.sum(n_b > 0), 1).astype(jnp.float32)
    return jnp.where(n_b > 0, 1.0 / (jnp.maximum(n_b, 1.0) * rows), 0.0)
  return jnp.ones((p.shape[0], 1), jnp.float32)


def _weights(logp: Array, batch: Batch, config: IPAConfig) -> tuple[Array, Array, dict]:
  """Per-token RL and IL weights (stop-gradient) and the weight-side metrics.

  Per-unit quantities (ratios, mismatch masks, returns, IS weights) are computed in the
  unit space of their level (`ale.ipa.units`): once per token, chunk piece or row, then
  broadcast to tokens. At chunk level the sub-block space is used when no sub-block of
  16 tokens mixes two chunks (the usual packed layout; no scatter over B·T tokens), and
  the exact-for-any-layout scatter space otherwise, picked by a `lax.cond`.
  """
  _check_batch(logp, batch)
  return_level, ratio_level, mask_level = config.levels
  lp = jax.lax.stop_gradient(jnp.asarray(logp, jnp.float32))
  p = jnp.asarray(batch.policy_mask).astype(bool)
  adv = jnp.asarray(batch.advantages, jnp.float32)
  chunk_ids = batch.chunk_ids
  needs_chunks = "chunk" in (return_level, ratio_level) or (
    config.masking and mask_level == "chunk"
  )
  if chunk_ids is None and needs_chunks:
    chunk_ids = segment_chunks(p)
  if batch.il_mask is not None:
    il = p & jnp.asarray(batch.il_mask).astype(bool)
    rl = p & ~il
  else:
    il, rl = None, p
  arrays = dict(
    lp=lp, rl=rl, il=il, adv=adv,
    old=jnp.asarray(batch.old_logp, jnp.float32),
    beh=jnp.asarray(batch.behavior_logp, jnp.float32),
    r_star=None if batch.expert_reward is None else jnp.asarray(batch.expert_reward, jnp.float32),
    steps=None if batch.steps_to_end is None else jnp.asarray(batch.steps_to_end),
    chunk_ids=None if chunk_ids is None else jnp.asarray(chunk_ids).astype(jnp.int32),
  )  # fmt: skip

  if needs_chunks:
    sb, fits = units.sub_block_layout(arrays["chunk_ids"])

    def fast(a):
      return _unit_weights(a, config, units.SubBlockChunkUnits(a["chunk_ids"], sb))

    def general(a):
      return _unit_weights(a, config, units.ScatterChunkUnits(a["chunk_ids"]))

    w_rl, w_il, stats = jax.lax.cond(fits, fast, general, arrays)
  else:
    w_rl, w_il, stats = _unit_weights(arrays, config, None)

  aux = dict(p=p, rl=rl, il=il, adv=adv, chunk_ids=chunk_ids, stats=stats)
  return jax.lax.stop_gradient(w_rl), jax.lax.stop_gradient(w_il), aux


def _unit_weights(a: dict, config: IPAConfig, chunk_units) -> tuple[Array, Array, dict]:
  """`_weights`' body given the chunk unit space (None when no level is "chunk")."""
  shape = a["lp"].shape
  rl, il, adv = a["rl"], a["il"], a["adv"]
  spaces = {"token": units.TokenUnits(shape), "sequence": units.RowUnits(shape)}
  if chunk_units is not None:
    spaces["chunk"] = chunk_units
  return_level, ratio_level, mask_level = config.levels

  def log_ratios(space, mode: str, diffs: list[Array], mask: Array):
    """Aggregated log-ratios per unit (E4/E9 "geometric": mean; "product": sum)."""
    sums, local = space.reduce(diffs, mask)
    if mode == "geometric" and space.level != "token":
      count = jnp.maximum(sums[-1], 1.0)
      return [s / count for s in sums[:-1]], local
    return sums[:-1], local

  # Returns (E8 at chunk level; the undiscounted advantage otherwise), as a per-unit
  # discount γ^Δ in the chunk space, or per token when `steps_to_end` is per token.
  disc, disc_level = None, "sequence"
  if return_level == "chunk":
    cu = spaces["chunk"]
    delta = units.unit_deltas(cu.unit_chunk_ids, cu.num_chunks(), a["steps"], shape[1])
    if delta is None:
      disc_level = "token"
      disc = discounts(a["chunk_ids"], config.gamma, a["steps"])
    else:
      disc_level = "chunk"
      disc = _pow(config.gamma, delta.astype(jnp.float32))

  # Ratios π_θ/π_θold (E4/E9) and mismatch ratios π_θold/μ_θold (E6/E10), over RL
  # tokens; one shared pass when both sit at the same level and mode.
  lp, old, beh = a["lp"], a["old"], a["beh"]
  share = config.masking and ratio_level == mask_level and config.ratio == config.mismatch_ratio
  r_space = spaces[ratio_level]
  diffs = [lp - old] + ([old - beh] if share else [])
  logs, r_local = log_ratios(r_space, config.ratio, diffs, rl)
  ratio = jnp.exp(logs[0])  # reported even when ratio_clip=None turns IS off
  if config.masking:
    if share:
      log_mm = logs[1]
    else:
      (log_mm,), _ = log_ratios(spaces[mask_level], config.mismatch_ratio, [old - beh], rl)
    mm_ratio = jnp.exp(log_mm)
    keep = keep_mask(mm_ratio, config.mismatch_threshold, config.mismatch_band)
  else:
    mm_ratio = keep = None

  # Combine in one space: the common one when all levels agree, else tokens.
  levels_used = {ratio_level} | ({mask_level} if config.masking else set())
  if disc is not None:
    levels_used.add(disc_level)
  common = levels_used.pop() if len(levels_used) == 1 else "token"
  space = spaces[common]

  def at(level: str, u: Array) -> Array:
    return u if level == common else spaces[level].to_tokens(u)

  ratio_c = at(ratio_level, ratio)
  use_is = config.ratio_clip is not None
  if use_is:
    lo, hi = config.ratio_clip
    is_w = jnp.clip(ratio_c, lo, hi)
    if config.topr:
      is_w = jnp.where(adv[:, None] > 0, 1.0, is_w)  # E5: no IS on T⁺
  else:
    is_w = 1.0
  g_rl = adv[:, None] if disc is None else at(disc_level, disc) * adv[:, None]
  f_rl = config.lambda_rl * g_rl * is_w  # E11 / E5
  keep_c = at(mask_level, keep) if config.masking else None
  if common == "token":
    w_rl = jnp.where(rl if keep_c is None else rl & keep_c, f_rl, 0.0)
  else:
    if keep_c is not None:
      f_rl = jnp.where(keep_c, f_rl, 0.0)
    w_rl = jnp.where(rl, space.to_tokens(f_rl), 0.0)

  if il is not None:  # E12 imitation term on the expert prefix: no IS, no mask
    r_star = jnp.ones_like(adv) if a["r_star"] is None else a["r_star"]
    g_il = r_star[:, None]
    if disc is not None:
      g_il = spaces[disc_level].to_tokens(disc) * g_il
    w_il = config.lambda_il * g_il
    if config.il_policy_weight is not None:
      (log_pi,), _ = log_ratios(r_space, config.il_policy_weight, [lp], il)
      w_il = w_il * jnp.exp(r_space.to_tokens(log_pi))
    w_il = jnp.where(il, w_il, 0.0)
  else:
    w_il = jnp.zeros(shape, jnp.float32)

  # Metrics over RL tokens: per token, or as local-count-weighted sums over the
  # entries of the common unit space (where `common` is the ratio level).
  f32 = jnp.float32
  if common == "token":
    on = rl

    def total(m: Array) -> Array:
      return jnp.sum(m, dtype=f32)

    def mean(x: Array) -> Array:
      return jnp.sum(jnp.where(rl, x, 0.0)) / denom
  else:
    on = r_local > 0

    def total(m: Array) -> Array:
      return jnp.sum(jnp.where(m, r_local, 0.0))

    def mean(x: Array) -> Array:
      return jnp.sum(jnp.where(on, r_local * x, 0.0)) / denom

  def top(x: Array) -> Array:
    return jnp.max(jnp.where(on, x, 0.0))

  n_rl = total(on)
  denom = jnp.maximum(n_rl, 1.0)
  stats = {
    "num_rl_tokens": n_rl,
    "masked_fraction": total(on & ~keep_c) / denom if config.masking else f32(0),
    "ratio_mean": mean(ratio_c),
    "ratio_max": top(ratio_c),
  }
  if use_is:
    lo, hi = config.ratio_clip
    is_rows = jnp.ones_like(adv, bool) if not config.topr else adv <= 0
    is_tok = on & is_rows[:, None]
    clipped = is_tok & ((ratio_c < lo) | (ratio_c > hi))
    stats["clip_fraction"] = total(clipped) / jnp.maximum(total(is_tok), 1.0)
  else:
    stats["clip_fraction"] = f32(0)
  if config.masking:
    mm_c = at(mask_level, mm_ratio)
    stats["mismatch_ratio_mean"] = mean(mm_c)
    stats["mismatch_ratio_max"] = top(mm_c)
  return w_rl, w_il, stats


def _pow(gamma: float, delta: Array) -> Array:
  """γ^Δ (E8), float32."""
  if gamma == 1.0:
    return jnp.ones_like(delta)
  return jnp.exp(delta * jnp.log(jnp.asarray(gamma, jnp.float32)))


def ipa_weights(logp: Array, batch: Batch, config: IPAConfig) -> Array:
  """Per-token policy-gradient weight w_t, `[B, T]` (E5, E8–E12).

  For an RL token t of chunk c in row b (policy token not in `il_mask`):

    w_t = λ_RL · G_c · m_c · ( 1            if A_b > 0 and topr   (E5 / E11, T⁺)
                              [ρ_c]_lo^hi   otherwise )           (clipped IS, T⁻)

  with G_c the return (E8), ρ_c the ratio (E9/E4), m_c the mismatch mask (E10/E6), each
  at its configured level. For an IL token (E12): `w_t = λ_IL · G*_c · [π_θ(c)]`, with
  G*_c = γ^Δ · expert_reward. Zero off policy tokens. The paper's μ_θold(τ) factor in
  E5/E11 is the sampling distribution of the batch, i.e. the expectation, not a weight.
  """
  w_rl, w_il, _ = _weights(logp, batch, config)
  return w_rl + w_il


def ipa_loss(logp: Array, batch: Batch, config: IPAConfig) -> tuple[Array, dict[str, Array]]:
  """IPA surrogate loss `−Σ_t w_t · s_b · log π_θ(t)` and metrics (E3–E12).

  `w_t` is `ipa_weights` (stop-gradient), s_b the normalisation, so
  `d loss / d logp_t = −w_t · s_b` (= −w_t / N for `normalize="token"`, N the number
  of policy tokens in the batch). `config.granularity` picks IPA ("chunk") or the
  token/sequence-level baselines of the same REINFORCE variant.

  Args:
    logp: `[B, T]` current policy per-token log-probs (any model; see `token_logprobs`).
    batch: `Batch` of `[B, T]` / `[B]` arrays.
    config: `IPAConfig` (static under jit).

  Returns:
    (loss scalar float32, metrics dict of float32 scalars): `loss`, `rl_loss`,
    `il_loss`, `num_tokens`, `num_rl_tokens`, `num_il_tokens`, `num_chunks`,
    `num_positive_rows`, `masked_fraction` (RL tokens dropped by the mismatch mask),
    `ratio_mean`/`ratio_max` (IS ratio over RL tokens), `clip_fraction` (RL tokens in
    IS rows whose ratio lies outside `ratio_clip`) and, when masking is on,
    `mismatch_ratio_mean`/`mismatch_ratio_max`.
  """
  w_rl, w_il, aux = _weights(logp, batch, config)
  p = aux["p"]
  scale = _normalizer(p, config.normalize)
  logp = jnp.asarray(logp)
  lp = jnp.where(p, logp, 0.0).astype(jnp.float32)
  rl_loss = -jnp.sum(w_rl * scale * lp)
  il_loss = -jnp.sum(w_il * scale * lp)
  loss = rl_loss + il_loss

  f32 = jnp.float32
  stats = aux["stats"]
  if aux["chunk_ids"] is not None:
    n_chunks = jnp.sum(num_chunks(aux["chunk_ids"]), dtype=f32)
  else:  # count chunk starts instead of segmenting
    prev = jnp.pad(p[:, :-1], ((0, 0), (1, 0)))
    n_chunks = jnp.sum(p & ~prev, dtype=f32)
  metrics = {
    "loss": loss,
    "rl_loss": rl_loss,
    "il_loss": il_loss,
    "num_tokens": jnp.sum(p, dtype=f32),
    "num_rl_tokens": stats["num_rl_tokens"],
    "num_il_tokens": jnp.sum(aux["il"], dtype=f32) if aux["il"] is not None else f32(0),
    "num_chunks": n_chunks,
    "num_positive_rows": jnp.sum(aux["adv"] > 0, dtype=f32),
    **{k: v for k, v in stats.items() if k != "num_rl_tokens"},
  }
  return loss, jax.lax.stop_gradient(metrics)


def sft_loss(
  logp: Array,
  policy_mask: Array,
  turn_ids: Array,
  turn_mask: Array,
  eps: float = 1e-8,
  *,
  normalize: str = "sequence",
) -> tuple[Array, dict[str, Array]]:
  """Error- and task-masked SFT loss (E1, E2).

    L_SFT = − Σ_k m_k log π_θ(c_k | s_k) / (Σ_k m_k |c_k| + ε),   m_k = m_k^err · m_k^task

  with log π_θ(c_k|s_k) the sum of turn k's policy-token log-probs and |c_k| its policy
  token count.

  Args:
    logp: `[B, T]` per-token log-probs of the current policy.
    policy_mask: `[B, T]` 1 on the assistant (completion) tokens.
    turn_ids: `[B, T]` int, index k of the turn a token belongs to, −1 off-turn.
    turn_mask: `[B, max_turns]` m_k = m_err · m_task per turn (ids ≥ max_turns read 0).
    eps: ε of E1.
    normalize: "sequence": E1 per trajectory (row), averaged over the B rows;
      "token": E1 over the whole batch as one set of turns (Σ over all rows / total).

  Returns:
    (loss, metrics) with metrics `num_tokens` (unmasked policy tokens, Σ m_k |c_k|) and
    `masked_token_fraction` (policy tokens on turns that m_k removes).
  """
  logp = jnp.asarray(logp)
  shape = logp.shape
  for name, v in (("policy_mask", policy_mask), ("turn_ids", turn_ids)):
    if jnp.shape(v) != shape:
      raise ValueError(f"{name} has shape {jnp.shape(v)}; expected logp's shape {shape}")
  tm = jnp.asarray(turn_mask)
  if tm.ndim != 2 or tm.shape[0] != shape[0]:
    raise ValueError(f"turn_mask must be [B, max_turns] with B = {shape[0]}; got {tm.shape}")
  if normalize not in ("sequence", "token"):
    raise ValueError(f"sft_loss normalize={normalize!r}; use 'sequence' or 'token'")
  p = jnp.asarray(policy_mask).astype(bool)
  tid = jnp.asarray(turn_ids).astype(jnp.int32)
  on_turn = p & (tid >= 0)
  m_tok = jnp.take_along_axis(
    tm.astype(jnp.float32), jnp.maximum(tid, 0), axis=1, mode="fill", fill_value=0.0
  )
  m_tok = jnp.where(on_turn, m_tok, 0.0)
  num = jnp.sum(jnp.where(m_tok > 0, m_tok * logp.astype(jnp.float32), 0.0), axis=1)
  den = jnp.sum(m_tok, axis=1)
  if normalize == "sequence":
    loss = -jnp.mean(num / (den + eps))
  else:
    loss = -jnp.sum(num) / (jnp.sum(den) + eps)
  metrics = {
    "num_tokens": jnp.sum(m_tok),
    "masked_token_fraction": 1.0
    - jnp.sum(m_tok) / jnp.maximum(jnp.sum(on_turn, dtype=jnp.float32), 1.0),
  }
  return loss, jax.lax.stop_gradient(metrics)
