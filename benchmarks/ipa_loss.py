"""Benchmark: value+grad of `ale.ipa.ipa_loss` at B=32, T=8192 on CPU.

Chunk (IPA) vs token vs sequence level, each beside the plain-NumPy loop reference
(tests/ipa/reference.py, re-derived from PAPER.md). Prints one table.

  python3 benchmarks/ipa_loss.py [--batch 32] [--seq 8192] [--iters 20] [--rounds 7]

Targets (issue 3): chunk level within 1.2x of token level; >= 50x faster than NumPy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402

from ale import ipa  # noqa: E402
from ale.ipa import units  # noqa: E402
from tests.ipa import reference as ref  # noqa: E402

LEVELS = ("token", "chunk", "sequence")


def packed_batch(rng: np.random.Generator, B: int, T: int):
  """Rows like real agent trajectories: prompt, then completions (chunks of 50–400 tokens)
  separated by observations (20–300 tokens), then padding."""
  pm = np.zeros((B, T), bool)
  for b in range(B):
    t = int(rng.integers(100, 400))
    end = int(rng.integers(T // 2, T))
    while t < end:
      n = int(rng.integers(50, 400))
      pm[b, t : min(t + n, end)] = True
      t += n + int(rng.integers(20, 300))
  logp = rng.normal(-1.0, 0.3, (B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.05, (B, T))).astype(np.float32)
  beh = (old + rng.normal(0, 0.05, (B, T))).astype(np.float32)
  adv = rng.choice([-1.0, 0.0, 1.0], B).astype(np.float32)
  return logp, dict(policy_mask=pm, advantages=adv, old_logp=old, behavior_logp=beh)


def time_interleaved(cases: dict, *, iters: int, rounds: int) -> dict:
  """Best-of-`rounds` mean wall and process-CPU time (ms) of `iters` calls per case.

  The cases take turns round by round, so a change in the shared machine's load hits
  them alike. CPU time is steadier than wall time on a shared machine (it excludes
  time the process waits for a core), so the ratios use it.
  """
  best = {name: [float("inf"), float("inf")] for name in cases}
  for fn, a in cases.values():
    jax.block_until_ready(fn(*a))
  for _ in tqdm.trange(rounds, desc="timing rounds", file=sys.stderr, leave=False):
    for name, (fn, a) in cases.items():
      t0, c0 = time.perf_counter(), time.process_time()
      for _ in range(iters):
        out = fn(*a)
      jax.block_until_ready(out)
      best[name][0] = min(best[name][0], (time.perf_counter() - t0) / iters * 1e3)
      best[name][1] = min(best[name][1], (time.process_time() - c0) / iters * 1e3)
  return best


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--seq", type=int, default=8192)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--rounds", type=int, default=7)
  args = ap.parse_args()
  B, T = args.batch, args.seq

  logp, raw = packed_batch(np.random.default_rng(0), B, T)
  chunk_ids = ipa.segment_chunks(jnp.asarray(raw["policy_mask"]))
  batch = ipa.Batch(**{k: jnp.asarray(v) for k, v in raw.items()}, chunk_ids=chunk_ids)
  batch_no_ids = ipa.Batch(**{k: jnp.asarray(v) for k, v in raw.items()})
  lp = jnp.asarray(logp)
  n_chunks = int(jnp.sum(ipa.num_chunks(chunk_ids)))
  print(
    f"# B={B} T={T}: {int(raw['policy_mask'].sum())} policy tokens, {n_chunks} chunks; "
    f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs; loadavg {os.getloadavg()[0]:.1f}",
    file=sys.stderr,
  )

  _, fits = units.sub_block_layout(chunk_ids)
  print(f"# chunk level path: {'sub-block' if bool(fits) else 'scatter fallback'}", file=sys.stderr)

  fns, cases = {}, {}
  for level in LEVELS:
    cfg = ipa.IPAConfig(granularity=level, gamma=0.95, mismatch_threshold=2.0)
    fns[level] = jax.jit(
      jax.value_and_grad(lambda x, b, c=cfg: ipa.ipa_loss(x, b, c), has_aux=True)
    )
    cases[level] = (fns[level], (lp, batch))
    cases[level + "/no_ids"] = (fns[level], (lp, batch_no_ids))
  print(f"# timing JAX, {args.rounds} interleaved rounds ...", file=sys.stderr)
  times = time_interleaved(cases, iters=args.iters, rounds=args.rounds)

  rows = []
  for level in LEVELS:
    cfg = ipa.IPAConfig(granularity=level, gamma=0.95, mismatch_threshold=2.0)
    (loss, _), grad = fns[level](lp, batch)
    print(f"# timing NumPy loop reference {level} level (one call) ...", file=sys.stderr)
    t0 = time.perf_counter()
    ref_loss, _, ref_wscaled = ref.ipa_loss(logp, raw, cfg)  # value; grad = -w*s
    ref_ms = (time.perf_counter() - t0) * 1e3
    err = float(np.max(np.abs(np.asarray(grad) + ref_wscaled)) / np.max(np.abs(ref_wscaled)))
    assert np.isclose(float(loss), ref_loss, rtol=1e-4, atol=1e-6), (level, loss, ref_loss)
    ms, cpu = times[level]
    rows.append((level, ms, cpu, times[level + "/no_ids"][1], ref_ms, err))
  jax_ms = {level: cpu for level, _, cpu, *_ in rows}

  print()
  print("| level    | JAX wall (ms) | JAX CPU (ms) | vs token (CPU) | CPU, chunk_ids=None (ms) "
        "| NumPy loop ref (ms) | speedup vs NumPy (wall) | grad rel. err |")  # fmt: skip
  print("|----------|--------------:|-------------:|---------------:|-------------------------:"
        "|--------------------:|------------------------:|--------------:|")  # fmt: skip
  for level, ms, cpu, cpu_seg, ref_ms, err in rows:
    print(
      f"| {level:<8} | {ms:13.3f} | {cpu:12.3f} | {cpu / jax_ms['token']:13.2f}x "
      f"| {cpu_seg:24.3f} | {ref_ms:19.0f} | {ref_ms / ms:22.0f}x | {err:13.1e} |"
    )


if __name__ == "__main__":
  main()
