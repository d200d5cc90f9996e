"""Random packed batches with the awkward rows the IPA functions must handle."""

from __future__ import annotations

import numpy as np


def random_policy_mask(rng: np.random.Generator, B: int, T: int) -> np.ndarray:
  """Rows of prompt / completion / observation / padding spans."""
  pm = np.zeros((B, T), bool)
  for b in range(B):
    t = int(rng.integers(0, 4))
    end = T - int(rng.integers(0, T // 4 + 1))  # padding tail
    while t < end:
      n = int(rng.integers(1, 7))
      pm[b, t : min(t + n, end)] = True
      t += n + int(rng.integers(1, 4))
  return pm


def random_batch(
  rng: np.random.Generator,
  B: int = 8,
  T: int = 40,
  *,
  il: bool = False,
  special_rows: bool = True,
  nan_padding: bool = True,
) -> tuple[np.ndarray, dict]:
  """(logp [B, T] float32, batch dict of numpy arrays with `Batch` field names).

  With `special_rows` (needs B ≥ 6): row 0 has no policy token, row 1 one chunk, row 2
  a long padding tail, row 3 a sampler far from the trainer (all masked by H ≈ 2),
  rows 4/5 zero and negative advantages. Off-policy positions hold NaN when
  `nan_padding`, so any leak of padding into the loss shows.
  """
  pm = random_policy_mask(rng, B, T)
  adv = rng.choice([-1.0, 0.0, 1.0, 0.5, -0.3], size=B).astype(np.float32)
  logp = rng.normal(-1.0, 0.5, (B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (B, T))).astype(np.float32)
  beh = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
  if special_rows:
    assert B >= 6
    pm[0] = False
    pm[1] = False
    pm[1, 3 : 3 + max(2, T // 5)] = True
    pm[2, T // 3 :] = False
    beh[3] = old[3] - 2.0  # π_old / μ = e² > H = 2 everywhere
    adv[4] = 0.0
    adv[5] = -1.0
    adv[1] = 1.0
  batch = {
    "policy_mask": pm,
    "advantages": adv,
    "old_logp": old,
    "behavior_logp": beh,
  }
  if il:
    ilm = np.zeros((B, T), bool)
    for b in range(B):
      cut = int(rng.integers(0, T))
      ilm[b, :cut] = True  # expert prefix
    batch["il_mask"] = ilm & pm
    batch["expert_reward"] = rng.uniform(0.5, 1.5, B).astype(np.float32)
  if nan_padding:
    for arr in (logp, old, beh):
      arr[~pm] = np.nan
  return logp, batch
