"""Forward+backward tokens/s: ale's Qwen3-MoE (JAX, jit) vs transformers (PyTorch), CPU.

One run, one table. Same config (the `small` preset: 4 layers, 16 experts top-2,
~7M parameters), same batch, same loss (next-token cross-entropy + router aux loss),
float32, and the same thread count for both frameworks (`--threads`, default all
cores). Rows: the transformers baseline (its default experts implementation, reported),
then ale with each dispatch: "blocked" (the CPU default of moe_impl="auto"), "bucketed"
(per-expert capacity, no weight copies), "ragged" (`jax.lax.ragged_dot`) and "dense"
(all experts on all tokens). The whole model is randomly initialised, and its routers
are unbalanced (up to 3.6x the mean load on one expert); the one-block rows use a
near-uniform router, as a router trained with the load-balancing loss tends to be.

Threads: torch splits each op over `torch.set_num_threads(N)` threads. XLA:CPU runs each
op on one thread (it only overlaps independent ops), so ale also gets a data-parallel
row: N simulated host devices (`--xla_force_host_platform_device_count=N`, one thread
each), the batch split over a `data` mesh axis, weights replicated, the MoE dispatch per
shard (`jax.shard_map`) -- N threads for both frameworks. Times are the median of
interleaved rounds, wall clock and process CPU time (a shared machine: CPU time is the
steadier of the two).

    python3 benchmarks/model.py [--batch 4 --seq 256 --steps 5 --threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--preset", default="small")
  return p.parse_args()


ARGS = parse()
# XLA:CPU sizes its intra-op pool from the visible cores: restrict both frameworks alike.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={ARGS.threads}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if ARGS.threads < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
  os.sched_setaffinity(0, set(range(ARGS.threads)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from ale.models import (  # noqa: E402
  Qwen3MoeForCausalLM,
  batch_sharding,
  count_params,
  get_preset,
  make_mesh,
  moe,
  shard_model,
)


def interleaved(fns: dict, steps: int, warmup: int) -> dict:
  """Median seconds per call; calls are interleaved round-robin so load drift (a shared
  machine) hits every implementation alike."""
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  times = {k: [] for k in fns}
  cpu = {k: [] for k in fns}
  for _ in tqdm(range(steps), desc="timing rounds", leave=False):
    for name, fn in fns.items():
      t, c = time.perf_counter(), time.process_time()
      fn()
      times[name].append(time.perf_counter() - t)
      cpu[name].append(time.process_time() - c)
  med = statistics.median
  return {k: med(v) for k, v in times.items()}, {k: med(v) for k, v in cpu.items()}


def moe_block_step(cfg, impl, ntok):
  """fwd+bwd of one MoE block's dispatch alone (router + experts), `ntok` tokens."""
  ks = jax.random.split(jax.random.key(1), 5)
  e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
  x = jax.random.normal(ks[0], (ntok, d))
  wr = jax.random.normal(ks[1], (d, e)) * 0.1
  ws = [
    jax.random.normal(k, s) * 0.05
    for k, s in zip(ks[2:], [(e, d, f), (e, d, f), (e, f, d)], strict=True)
  ]

  def loss(x, wr, ws):
    r = moe.route(x @ wr, cfg.num_experts_per_tok, cfg.norm_topk_prob, x.dtype)
    return jnp.sum(moe.dispatch(impl, x, r, *ws) ** 2)

  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  return lambda: jax.block_until_ready(step(x, wr, ws))


def ale_step(cfg, impl, ids, devices=1):
  model = Qwen3MoeForCausalLM(cfg.replace(moe_impl=impl), rngs=nnx.Rngs(0))
  mesh = None
  if devices > 1:  # data parallel over host devices: batch split, weights replicated
    mesh = make_mesh(data=devices, fsdp=1, devices=jax.devices()[:devices])
    shard_model(model, mesh)
    ids = jax.device_put(ids, batch_sharding(mesh, shape=ids.shape))
  graphdef, state = nnx.split(model)

  def loss_fn(state, ids):
    logits, aux = nnx.merge(graphdef, state)(ids)
    lp = jax.nn.log_softmax(logits[:, :-1], -1)
    ce = -jnp.mean(jnp.take_along_axis(lp, ids[:, 1:, None], -1))
    return ce + cfg.router_aux_loss_coef * aux

  step = jax.jit(jax.value_and_grad(loss_fn))
  if mesh is None:
    return lambda: jax.block_until_ready(step(state, ids)), count_params(model)

  def run():
    with jax.set_mesh(mesh):
      return jax.block_until_ready(step(state, ids))

  return run, count_params(model)


def torch_step(cfg, ids):
  from transformers import Qwen3MoeConfig as HFConfig
  from transformers import Qwen3MoeForCausalLM as HFModel

  hf_cfg = HFConfig(
    **{k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures", "model_type")}
  )
  model = HFModel(hf_cfg).train()
  impl = (
    model.config._experts_implementation_internal
    if hasattr(model.config, "_experts_implementation_internal")
    else "?"
  )
  x = torch.tensor(np.asarray(ids), dtype=torch.long)

  def step():
    model.zero_grad(set_to_none=True)
    out = model(x, labels=x, output_router_logits=True)
    out.loss.backward()

  return step, impl


def main():
  torch.set_num_threads(ARGS.threads)
  cfg = get_preset(ARGS.preset)
  ids = jax.random.randint(jax.random.key(0), (ARGS.batch, ARGS.seq), 0, cfg.vocab_size, jnp.int32)
  ntok = ARGS.batch * ARGS.seq
  fns, names = {}, {}
  fns["torch"], impl = torch_step(cfg, ids)
  names["torch"] = f"model: transformers {transformers.__version__} torch (experts={impl})"
  nparams = 0
  if ARGS.threads > 1 and jax.device_count() >= ARGS.threads:
    fns["dp"], nparams = ale_step(cfg, "blocked", ids, devices=ARGS.threads)
    names["dp"] = f"model: ale moe_impl=blocked, data-parallel on {ARGS.threads} devices"
  for ale_impl in ("blocked", "bucketed", "ragged", "dense"):
    fns[ale_impl], nparams = ale_step(cfg, ale_impl, ids)
    names[ale_impl] = f"model: ale (jax {jax.__version__}) moe_impl={ale_impl}"
  for ale_impl in ("blocked", "bucketed", "ragged", "dense"):
    fns["moe_" + ale_impl] = moe_block_step(cfg, ale_impl, ntok)
    names["moe_" + ale_impl] = f"one MoE block, balanced router: moe_impl={ale_impl}"
  t, cpu = interleaved(fns, ARGS.steps, ARGS.warmup)

  print(
    f"\nfwd+bwd, preset={ARGS.preset} ({nparams / 1e6:.1f}M params, {cfg.num_experts} experts "
    f"top-{cfg.num_experts_per_tok}), batch {ARGS.batch}x{ARGS.seq} = {ntok} tokens, float32, "
    f"{ARGS.threads} threads, median of {ARGS.steps} interleaved rounds"
  )
  print(
    f"| {'what':<60} | {'ms/step':>8} | {'tokens/s':>9} | {'vs torch':>8} | {'vs dense':>8} "
    f"| {'CPU ms':>8} |"
  )
  print(f"|{'-' * 62}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
  for k, name in names.items():
    dense = t["moe_dense"] if k.startswith("moe_") else t["dense"]
    vs_torch = f"{t['torch'] / t[k]:7.2f}x" if not k.startswith("moe_") else f"{'-':>8}"
    print(
      f"| {name:<60} | {t[k] * 1e3:8.1f} | {ntok / t[k]:9.0f} | {vs_torch} | "
      f"{dense / t[k]:7.2f}x | {cpu[k] * 1e3:8.1f} |"
    )


if __name__ == "__main__":
  main()
