"""ale.models: the Flax NNX Qwen3-MoE policy, sharding rules and HF checkpoints."""

from ale.models import gmm
from ale.models.checkpoint import from_pretrained, save_pretrained
from ale.models.config import Qwen3MoeConfig, get_preset, list_presets
from ale.models.logprobs import sequence_logprobs, token_logprobs_from_logits
from ale.models.qwen3_moe import Cache, Qwen3MoeForCausalLM, count_params, init_cache
from ale.models.sharding import (
  CACHE_AXES,
  DEFAULT_RULES,
  MESH_AXES,
  batch_sharding,
  cache_shardings,
  logical_sharding,
  logical_to_spec,
  make_mesh,
  shard_model,
  state_shardings,
)

__all__ = [
  "CACHE_AXES",
  "Cache",
  "DEFAULT_RULES",
  "MESH_AXES",
  "Qwen3MoeConfig",
  "Qwen3MoeForCausalLM",
  "batch_sharding",
  "cache_shardings",
  "count_params",
  "from_pretrained",
  "get_preset",
  "gmm",
  "init_cache",
  "list_presets",
  "logical_sharding",
  "logical_to_spec",
  "make_mesh",
  "save_pretrained",
  "sequence_logprobs",
  "shard_model",
  "state_shardings",
  "token_logprobs_from_logits",
]
