"""Forward+backward tokens/s: ale's Qwen3-MoE (JAX, jit) vs transformers (PyTorch), CPU.

One run, one table. Same config (the `small` preset: 4 layers, 16 experts top-2,
~7M parameters), same batch, same loss (next-token cross-entropy + router aux loss),
float32, and the same thread count for both frameworks (`--threads`, default all
cores). Rows: the transformers baseline (its default experts implementation, reported),
then ale with each dispatch: "blocked" (the CPU default of moe_impl="auto"), "ragged"
(`jax.lax.ragged_dot`) and "dense" (all experts on all tokens).

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
os.environ.setdefault(
  "XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}"
)
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

from ale.models import Qwen3MoeForCausalLM, count_params, get_preset, moe  # noqa: E402


def interleaved(fns: dict, steps: int, warmup: int) -> dict:
  """Median seconds per call; calls are interleaved round-robin so load drift (a shared
  machine) hits every implementation alike."""
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  times = {k: [] for k in fns}
  for _ in tqdm(range(steps), desc="timing rounds", leave=False):
    for name, fn in fns.items():
      t = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in times.items()}


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


def ale_step(cfg, impl, ids):
  model = Qwen3MoeForCausalLM(cfg.replace(moe_impl=impl), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)

  def loss_fn(state, ids):
    logits, aux = nnx.merge(graphdef, state)(ids)
    lp = jax.nn.log_softmax(logits[:, :-1], -1)
    ce = -jnp.mean(jnp.take_along_axis(lp, ids[:, 1:, None], -1))
    return ce + cfg.router_aux_loss_coef * aux

  step = jax.jit(jax.value_and_grad(loss_fn))
  return lambda: jax.block_until_ready(step(state, ids)), count_params(model)


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
  for ale_impl in ("blocked", "ragged", "dense"):
    fns[ale_impl], nparams = ale_step(cfg, ale_impl, ids)
    names[ale_impl] = f"model: ale (jax {jax.__version__}) moe_impl={ale_impl}"
  for ale_impl in ("blocked", "ragged", "dense"):
    fns["moe_" + ale_impl] = moe_block_step(cfg, ale_impl, ntok)
    names["moe_" + ale_impl] = f"one MoE block: moe_impl={ale_impl}"
  t = interleaved(fns, ARGS.steps, ARGS.warmup)

  print(
    f"\nfwd+bwd, preset={ARGS.preset} ({nparams / 1e6:.1f}M params, {cfg.num_experts} experts "
    f"top-{cfg.num_experts_per_tok}), batch {ARGS.batch}x{ARGS.seq} = {ntok} tokens, float32, "
    f"{ARGS.threads} threads, median of {ARGS.steps} interleaved rounds"
  )
  print(f"| {'what':<56} | {'ms/step':>8} | {'tokens/s':>9} | {'vs torch':>8} | {'vs dense':>8} |")
  print(f"|{'-' * 58}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 10}|")
  for k, name in names.items():
    dense = t["moe_dense"] if k.startswith("moe_") else t["dense"]
    vs_torch = f"{t['torch'] / t[k]:7.2f}x" if not k.startswith("moe_") else f"{'-':>8}"
    print(
      f"| {name:<56} | {t[k] * 1e3:8.1f} | {ntok / t[k]:9.0f} | {vs_torch} | {dense / t[k]:7.2f}x |"
    )


if __name__ == "__main__":
  main()
