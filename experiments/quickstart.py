"""The main job: a short, real run through the whole stack on a CPU.

    python -m experiments.quickstart [--out_dir runs/quickstart] [--steps 20]

Stages (each prints one line; a summary table follows):
  1. env      — a scripted expert solves an in-process simulated tool task (ale.envs, GEM).
  2. chat     — its trajectory is rendered with the one chat template into tokens and the
                policy mask; chunks are segmented (E7) and chunk returns computed (E8).
  3. model    — a tiny Qwen3-MoE policy scores the trajectory (per-token log-probs).
  4. ipa      — the jitted IPA loss (E11/E12) at chunk, token and sequence level, then a
                few Optax steps of the chunk-level loss on that trajectory (the log-prob of
                the expert's tokens must rise).
  5. sandbox  — a Docker sandbox (ale.sandbox, no network, limits) runs one command; skipped
                with the reason when no engine answers (ALE_REQUIRE_DOCKER=1 makes it fail).

Writes `metrics.jsonl` (one record per stage and per optimisation step) and `summary.png`
(IPA loss and expert log-prob over the steps; stage wall times) to `--out_dir`.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import time

from absl import app, flags, logging

OUT_DIR = flags.DEFINE_string(
  "out_dir", "runs/quickstart", "Where metrics.jsonl and summary.png go."
)
STEPS = flags.DEFINE_integer("steps", 10, "Optax steps of the chunk-level IPA loss.")
ENV_ID = flags.DEFINE_string("env_id", "ale/SimFiles-v0", "Simulated GEM environment to solve.")
DIFFICULTY = flags.DEFINE_string("difficulty", "medium", "Difficulty of the simulated task.")
SEED = flags.DEFINE_integer("seed", 0, "Seed for the task and the model.")
SANDBOX = flags.DEFINE_bool("sandbox", True, "Run the Docker sandbox stage.")


class _Recorder:
  """Appends JSON records to metrics.jsonl and keeps stage timings for the summary."""

  def __init__(self, out_dir: pathlib.Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    self.path = out_dir / "metrics.jsonl"
    self.path.write_text("")
    self.stages: list[tuple[str, float, str]] = []

  def write(self, record: dict) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")

  def stage(self, name: str, seconds: float, summary: str, **metrics) -> None:
    self.stages.append((name, seconds, summary))
    self.write({"stage": name, "seconds": round(seconds, 3), **metrics})
    print(f"[{name:8s}] {seconds:6.2f}s  {summary}", flush=True)


def run_expert_episode(env_id: str, difficulty: str, seed: int):
  """Stage 1: the scripted expert's episode as OpenAI-style messages (M6's τ*)."""
  import ale.envs

  env = ale.envs.make(env_id, difficulty=difficulty)
  obs, _ = env.reset(seed=seed)
  messages = [
    {
      "role": "system",
      "content": "You are an agent. Use the tools to finish the task, then call submit.",
    },
    {"role": "user", "content": obs},
  ]
  reward, info = 0.0, {}
  for action in env.unwrapped.expert_actions():
    obs, reward, terminated, truncated, info = env.step(action)
    messages.append({"role": "assistant", "content": action})
    if terminated or truncated:
      break
    messages.append({"role": "tool", "content": obs})
  tools = env.unwrapped.tools
  env.close()
  return messages, tools, float(reward), info


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx

  from ale import ipa
  from ale.chat import ByteTokenizer, render_chat
  from ale.models import Qwen3MoeForCausalLM, get_preset, sequence_logprobs

  out_dir = pathlib.Path(OUT_DIR.value)
  rec = _Recorder(out_dir)
  print(
    f"ale quickstart: jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}; writing {out_dir}/"
  )

  # 1. env
  t0 = time.perf_counter()
  messages, tools, reward, info = run_expert_episode(ENV_ID.value, DIFFICULTY.value, SEED.value)
  n_calls = sum(m["role"] == "assistant" for m in messages)
  rec.stage(
    "env",
    time.perf_counter() - t0,
    f"{ENV_ID.value} ({DIFFICULTY.value}): expert made {n_calls} tool calls, reward {reward:.1f}",
    reward=reward,
    tool_calls=n_calls,
    success=bool(info.get("success", reward > 0)),
  )

  # 2. chat template -> tokens, policy mask, chunks, chunk returns
  t0 = time.perf_counter()
  tok = ByteTokenizer()
  chat = render_chat(messages, tok, tools=tools)
  tokens = jnp.asarray([chat.token_ids], jnp.int32)
  policy_mask = jnp.asarray([chat.policy_mask], jnp.int32)
  chunk_ids = ipa.segment_chunks(policy_mask)
  returns = ipa.chunk_returns(chunk_ids, jnp.asarray([reward], jnp.float32), gamma=0.9)
  n_chunks = int(ipa.num_chunks(chunk_ids)[0])
  rec.stage(
    "chat",
    time.perf_counter() - t0,
    f"{tokens.shape[1]} tokens, {int(policy_mask.sum())} policy tokens in {n_chunks} chunks; "
    f"chunk returns {[round(float(g), 3) for g in np.unique(np.asarray(returns)[np.asarray(chunk_ids) >= 0])]}",
    tokens=int(tokens.shape[1]),
    policy_tokens=int(policy_mask.sum()),
    chunks=n_chunks,
  )

  # 3. model
  t0 = time.perf_counter()
  config = get_preset("tiny")
  model = Qwen3MoeForCausalLM(config, rngs=nnx.Rngs(SEED.value))
  logp0 = sequence_logprobs(model, tokens)
  expert_logp0 = float((logp0 * policy_mask).sum() / policy_mask.sum())
  rec.stage(
    "model",
    time.perf_counter() - t0,
    f"tiny Qwen3-MoE ({config.num_experts} experts top-{config.num_experts_per_tok}): "
    f"mean expert-token log-prob {expert_logp0:.3f}",
    expert_logp=expert_logp0,
  )

  # 4. IPA: the three levels on the same batch, then a few optimisation steps.
  t0 = time.perf_counter()
  batch = ipa.Batch(
    policy_mask=policy_mask,
    advantages=jnp.asarray([reward], jnp.float32),
    old_logp=logp0,
    behavior_logp=logp0,
    chunk_ids=chunk_ids,
  )
  losses = {}
  ipa_loss = jax.jit(ipa.ipa_loss, static_argnums=2)
  for level in ("chunk", "token", "sequence"):
    loss, _ = ipa_loss(logp0, batch, ipa.IPAConfig(granularity=level, gamma=0.9))
    losses[level] = float(loss)
  config_ipa = ipa.IPAConfig(granularity="chunk", gamma=0.9, mismatch_threshold=2.0)
  optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer):
    def loss_fn(model):
      logp = sequence_logprobs(model, tokens)
      loss, metrics = ipa.ipa_loss(logp, batch, config_ipa)
      return loss, (logp, metrics)

    (loss, (logp, metrics)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, (logp * policy_mask).sum() / policy_mask.sum(), optax.global_norm(grads)

  history = []
  for step in range(STEPS.value):
    loss, expert_logp, gnorm = train_step(model, optimizer)
    history.append((float(loss), float(expert_logp)))
    rec.write(
      {
        "stage": "ipa_step",
        "step": step,
        "loss": float(loss),
        "expert_logp": float(expert_logp),
        "grad_norm": float(gnorm),
      }
    )
    if step % 5 == 0 or step == STEPS.value - 1:
      logging.info(
        "step %d loss %.4f expert log-prob %.4f |g| %.3f",
        step,
        float(loss),
        float(expert_logp),
        float(gnorm),
      )
  final_logp = history[-1][1] if history else expert_logp0
  rec.stage(
    "ipa",
    time.perf_counter() - t0,
    f"loss chunk {losses['chunk']:.4f} / token {losses['token']:.4f} / sequence {losses['sequence']:.4f}; "
    f"{STEPS.value} Adam steps: expert log-prob {expert_logp0:.3f} -> {final_logp:.3f}",
    **{f"loss_{k}": v for k, v in losses.items()},
    expert_logp_final=final_logp,
  )

  # 5. sandbox
  if SANDBOX.value:
    t0 = time.perf_counter()
    summary, metrics = asyncio.run(_sandbox_stage())
    rec.stage("sandbox", time.perf_counter() - t0, summary, **metrics)

  _plot(out_dir / "summary.png", history, rec.stages)
  print()
  print(f"{'stage':10s} {'seconds':>8s}  result")
  for name, seconds, summary in rec.stages:
    print(f"{name:10s} {seconds:8.2f}  {summary}")
  print(f"\nwrote {rec.path} and {out_dir / 'summary.png'}")


async def _sandbox_stage() -> tuple[str, dict]:
  from ale.sandbox import BASE_IMAGE, Client

  try:
    async with Client() as client:
      async with await client.create(BASE_IMAGE, memory_mb=256, cpus=1.0) as sb:
        res = await sb.exec(
          "python3 -c 'import os; print(6 * 7, os.getuid())'; ls /sys/class/net", timeout_s=30
        )
    out = res.stdout.split()
    return (
      f"{BASE_IMAGE}: exit {res.exit_code}, printed {out[:2]} (answer, uid), interfaces {out[2:]}, exec {res.duration_s * 1e3:.0f} ms",
      {"exit_code": res.exit_code, "stdout": res.stdout, "exec_ms": res.duration_s * 1e3},
    )
  except Exception as e:  # no engine here: say so, never fake the stage
    if os.environ.get("ALE_REQUIRE_DOCKER") == "1":
      raise
    return (
      f"skipped: no Docker engine ({type(e).__name__}: {e}); run `sudo bash scripts/docker_up.sh`",
      {"skipped": True},
    )


def _plot(path: pathlib.Path, history, stages) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  steps = range(len(history))
  axes[0].plot(steps, [h[0] for h in history], marker=".")
  axes[0].set(title="chunk-level IPA loss", xlabel="step")
  axes[1].plot(steps, [h[1] for h in history], marker=".", color="tab:green")
  axes[1].set(title="mean expert-token log-prob", xlabel="step")
  axes[2].barh([s[0] for s in stages], [s[1] for s in stages], color="tab:gray")
  axes[2].set(title="stage wall time (s)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


if __name__ == "__main__":
  from ale import runtime

  runtime.reexec_with_tcmalloc()  # XLA:CPU steps are ~20% faster with tcmalloc
  app.run(main)
