"""Shared fixtures for the inference tests: one tiny model and one engine per session."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ale.inference.engine import Engine
from ale.models import Qwen3MoeForCausalLM, get_preset


@pytest.fixture(scope="session")
def tiny_model():
  return Qwen3MoeForCausalLM(get_preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def engine(tiny_model):
  """4 slots x 1024 positions, prefill buckets 16/64/1024 (shared: compiled once)."""
  return Engine(
    tiny_model, max_concurrent_decodes=4, max_seq_len=1024, prefill_buckets=(16, 64, 1024)
  )


@pytest.fixture(scope="session")
def full_forward(tiny_model):
  """The training forward, jitted: tokens [B, T] -> log-softmax logits [B, T, V]."""
  graphdef, state = nnx.split(tiny_model)

  @jax.jit
  def fwd(state, tokens):
    logits, _ = nnx.merge(graphdef, state)(tokens)
    return jax.nn.log_softmax(logits, axis=-1)

  return lambda tokens: np.asarray(fwd(state, jnp.asarray(tokens, jnp.int32)))


def prompt(seed: int, length: int) -> list[int]:
  return [int(t) for t in np.random.default_rng(seed).integers(0, 256, length)]
