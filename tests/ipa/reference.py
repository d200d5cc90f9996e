"""Plain-NumPy loop reference for ale.ipa, re-derived from PAPER.md (not from the JAX code).

Everything is float64 and written as explicit loops over rows, chunks and tokens, the
way the equations read: E1–E2 (masked SFT), E4/E9 (geometric-mean ratios), E5 (TOPR
split), E6/E10 (mismatch masks), E7 (chunks), E8 (chunk returns), E11 (chunk-level
gradient weights), E12 (IL term). Slow on purpose; used by the tests and as the
benchmark's baseline.
"""

from __future__ import annotations

import math

import numpy as np


def segment_chunks(policy_mask, turn_starts=None):
  """E7: chunk k = k-th maximal run of policy tokens (a turn start also opens one)."""
  pm = np.asarray(policy_mask).astype(bool)
  B, T = pm.shape
  out = np.full((B, T), -1, np.int64)
  for b in range(B):
    k = -1
    inside = False
    for t in range(T):
      if pm[b, t]:
        opens = not inside or (turn_starts is not None and bool(turn_starts[b][t]))
        if opens:
          k += 1
        out[b, t] = k
        inside = True
      else:
        inside = False
  return out


def _chunks_of_row(ids_row):
  """{chunk id: [token positions]} for one row."""
  chunks: dict[int, list[int]] = {}
  for t, c in enumerate(ids_row):
    if c >= 0:
      chunks.setdefault(int(c), []).append(t)
  return chunks


def _delta(b, t, k, K, steps_to_end, T):
  """Chunks between chunk k and the terminal chunk (E8's Δ)."""
  if steps_to_end is None:
    return K - 1 - k
  s = np.asarray(steps_to_end)
  if s.ndim == 1:
    return float(s[b])
  if s.shape[1] == T:
    return float(s[b, t])
  return float(s[b, min(k, s.shape[1] - 1)])


def chunk_returns(chunk_ids, advantages, gamma, steps_to_end=None):
  """E8: G_k = γ^Δ · R on every token of chunk k; Δ = K−1−k unless given."""
  ids = np.asarray(chunk_ids)
  B, T = ids.shape
  out = np.zeros((B, T))
  for b in range(B):
    chunks = _chunks_of_row(ids[b])
    K = max(chunks) + 1 if chunks else 0
    for k, toks in chunks.items():
      for t in toks:
        out[b, t] = gamma ** _delta(b, t, k, K, steps_to_end, T) * float(advantages[b])
  return out


def unit_ratio(num_logp, den_logp, tokens, mode):
  """E4/E9: (Π_{t∈u} p(t)/q(t))^(1/|u|) (geometric) or Π p/q (product), in log space."""
  if not tokens:
    return 1.0
  log_prod = math.fsum(float(num_logp[t]) - float(den_logp[t]) for t in tokens)
  if mode == "geometric":
    return math.exp(log_prod / len(tokens))
  return math.exp(log_prod) if log_prod < 700 else math.inf


def _units(level, tokens, ids_row):
  """Units (lists of positions) of `tokens` at a level: token, chunk (E7) or sequence."""
  if level == "token":
    return [[t] for t in tokens]
  if level == "sequence":
    return [list(tokens)] if tokens else []
  by_chunk: dict[int, list[int]] = {}
  for t in tokens:
    by_chunk.setdefault(int(ids_row[t]), []).append(t)
  return list(by_chunk.values())


def _level(cfg, name):
  v = getattr(cfg, name)
  return cfg.granularity if v is None else v


def ipa_weights(logp, batch, cfg):
  """Per-token weights w [B, T] of the IPA gradient (E5, E8–E12) and metrics pieces.

  batch: dict of numpy arrays with the `Batch` field names; cfg: an IPAConfig (only its
  fields are read).
  """
  logp = np.asarray(logp, np.float64)
  B, T = logp.shape
  pm = np.asarray(batch["policy_mask"]).astype(bool)
  adv = np.asarray(batch["advantages"], np.float64)
  old = np.asarray(batch["old_logp"], np.float64)
  beh = np.asarray(batch["behavior_logp"], np.float64)
  ids = batch.get("chunk_ids")
  ids = segment_chunks(pm) if ids is None else np.asarray(ids)
  il_mask = batch.get("il_mask")
  ste = batch.get("steps_to_end")
  r_star = batch.get("expert_reward")
  ret_level, ratio_level, mask_level = (
    _level(cfg, "return_level"),
    _level(cfg, "ratio_level"),
    _level(cfg, "mask_level"),
  )
  masking = cfg.mismatch_threshold is not None or cfg.mismatch_band is not None
  ilw = {True: "product", False: None}.get(cfg.il_policy_weight, cfg.il_policy_weight)

  w = np.zeros((B, T))
  ratio_tok = np.ones((B, T))
  keep_tok = np.ones((B, T), bool)
  mm_tok = np.ones((B, T))
  rl_tok = np.zeros((B, T), bool)
  il_tok = np.zeros((B, T), bool)
  for b in range(B):
    chunks = _chunks_of_row(ids[b])
    K = max(chunks) + 1 if chunks else 0
    il_row = [bool(pm[b, t] and il_mask is not None and il_mask[b][t]) for t in range(T)]
    rl = [t for t in range(T) if pm[b, t] and not il_row[t]]
    il = [t for t in range(T) if il_row[t]]

    def ret(t, reward, b=b, K=K):
      if ret_level == "chunk":
        k = int(ids[b, t])
        return gamma_pow(cfg.gamma, _delta(b, t, k, K, ste, T)) * reward
      return reward

    # ratios π_θ/π_θold per unit (E4/E9) and mismatch π_θold/μ_θold per unit (E6/E10)
    for unit in _units(ratio_level, rl, ids[b]):
      r = unit_ratio(logp[b], old[b], unit, cfg.ratio)
      for t in unit:
        ratio_tok[b, t] = r
    if masking:
      for unit in _units(mask_level, rl, ids[b]):
        r = unit_ratio(old[b], beh[b], unit, cfg.mismatch_ratio)
        ok = True
        if cfg.mismatch_threshold is not None:
          ok = ok and r <= cfg.mismatch_threshold
        if cfg.mismatch_band is not None:
          ok = ok and cfg.mismatch_band[0] <= r <= cfg.mismatch_band[1]
        for t in unit:
          mm_tok[b, t] = r
          keep_tok[b, t] = ok
    for t in rl:
      rl_tok[b, t] = True
      if cfg.ratio_clip is None or (cfg.topr and adv[b] > 0):
        is_w = 1.0  # E5: weighted SL update on T⁺
      else:
        is_w = min(max(ratio_tok[b, t], cfg.ratio_clip[0]), cfg.ratio_clip[1])
      w[b, t] = cfg.lambda_rl * ret(t, adv[b]) * is_w * (1.0 if keep_tok[b, t] else 0.0)
    # E12: IL on expert-prefix chunks, G* from the expert reward, optional π_θ(c*) factor
    reward = 1.0 if r_star is None else float(r_star[b])
    pi_of = {}
    if ilw is not None:
      zero = np.zeros(T)
      for unit in _units(ratio_level, il, ids[b]):
        pi = unit_ratio(logp[b], zero, unit, ilw)
        for t in unit:
          pi_of[t] = pi
    for t in il:
      il_tok[b, t] = True
      w[b, t] = cfg.lambda_il * ret(t, reward) * pi_of.get(t, 1.0)
  return w, dict(ratio=ratio_tok, keep=keep_tok, mm=mm_tok, rl=rl_tok, il=il_tok, chunk_ids=ids)


def gamma_pow(gamma, delta):
  return float(gamma) ** float(delta)


def normalizer(policy_mask, normalize):
  """Per-token scale s [B, T]: loss = −Σ w s logp."""
  pm = np.asarray(policy_mask).astype(bool)
  B, T = pm.shape
  s = np.zeros((B, T))
  if normalize == "token":
    n = int(pm.sum())
    s[:] = 1.0 / max(n, 1)
  elif normalize == "sequence":
    rows = sum(1 for b in range(B) if pm[b].any())
    for b in range(B):
      n_b = int(pm[b].sum())
      if n_b:
        s[b, :] = 1.0 / (n_b * rows)
  else:
    s[:] = 1.0
  return s


def ipa_loss(logp, batch, cfg):
  """Surrogate loss −Σ w s logp and the metrics ipa_loss reports."""
  logp = np.asarray(logp, np.float64)
  pm = np.asarray(batch["policy_mask"]).astype(bool)
  w, aux = ipa_weights(logp, batch, cfg)
  s = normalizer(pm, cfg.normalize)
  B, T = logp.shape
  rl_loss = il_loss = 0.0
  for b in range(B):
    for t in range(T):
      if aux["rl"][b, t]:
        rl_loss -= w[b, t] * s[b, t] * logp[b, t]
      elif aux["il"][b, t]:
        il_loss -= w[b, t] * s[b, t] * logp[b, t]
  rl = [(b, t) for b in range(B) for t in range(T) if aux["rl"][b, t]]
  n_rl = len(rl)
  adv = np.asarray(batch["advantages"], np.float64)
  ids = aux["chunk_ids"]
  metrics = {
    "loss": rl_loss + il_loss,
    "rl_loss": rl_loss,
    "il_loss": il_loss,
    "num_tokens": float(pm.sum()),
    "num_rl_tokens": float(n_rl),
    "num_il_tokens": float(aux["il"].sum()),
    "num_chunks": float(sum(len(_chunks_of_row(ids[b])) for b in range(B))),
    "num_positive_rows": float(sum(1 for a in adv if a > 0)),
    "masked_fraction": sum(1 for bt in rl if not aux["keep"][bt]) / max(n_rl, 1),
    "ratio_mean": sum(aux["ratio"][bt] for bt in rl) / max(n_rl, 1),
    "ratio_max": max([aux["ratio"][bt] for bt in rl], default=0.0),
  }
  if cfg.ratio_clip is not None:
    lo, hi = cfg.ratio_clip
    is_tok = [bt for bt in rl if not (cfg.topr and adv[bt[0]] > 0)]
    clipped = [bt for bt in is_tok if not lo <= aux["ratio"][bt] <= hi]
    metrics["clip_fraction"] = len(clipped) / max(len(is_tok), 1)
  else:
    metrics["clip_fraction"] = 0.0
  if cfg.mismatch_threshold is not None or cfg.mismatch_band is not None:
    metrics["mismatch_ratio_mean"] = sum(aux["mm"][bt] for bt in rl) / max(n_rl, 1)
    metrics["mismatch_ratio_max"] = max([aux["mm"][bt] for bt in rl], default=0.0)
  return metrics["loss"], metrics, w * s


def sft_loss(logp, policy_mask, turn_ids, turn_mask, eps=1e-8, normalize="sequence"):
  """E1–E2: −Σ_k m_k log π(c_k|s_k) / (Σ_k m_k |c_k| + ε), per row then mean (or pooled)."""
  logp = np.asarray(logp, np.float64)
  B, T = logp.shape
  nums, dens = [], []
  for b in range(B):
    num = den = 0.0
    for k in range(np.shape(turn_mask)[1]):
      toks = [t for t in range(T) if policy_mask[b][t] and turn_ids[b][t] == k]
      log_pi = math.fsum(logp[b, t] for t in toks)  # log π(c_k | s_k)
      num += float(turn_mask[b][k]) * log_pi
      den += float(turn_mask[b][k]) * len(toks)
    nums.append(num)
    dens.append(den)
  if normalize == "sequence":
    return float(np.mean([-n / (d + eps) for n, d in zip(nums, dens, strict=True)]))
  return -sum(nums) / (sum(dens) + eps)


def token_logprobs(logits, tokens):
  """log softmax(logits)[token] in float64."""
  x = np.asarray(logits, np.float64)
  out = np.zeros(x.shape[:-1])
  for idx in np.ndindex(*x.shape[:-1]):
    row = x[idx]
    m = row.max()
    out[idx] = row[int(tokens[idx])] - (m + math.log(np.exp(row - m).sum()))
  return out
