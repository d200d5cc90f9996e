"""Parity with transformers' Qwen3MoeForCausalLM (torch, CPU) through real safetensors files."""

import jax.numpy as jnp
import numpy as np
import pytest

from ale.models import from_pretrained
from tests.models.hf_reference import hf_forward, make_hf_model

CONFIGS = {
  # GQA 4:2, head_dim 12 != hidden/heads, a dense layer in the stack, no top-k renorm, untied.
  "gqa2_headdim12_dense_layer": dict(
    num_hidden_layers=3,
    head_dim=12,
    mlp_only_layers=[1],
    norm_topk_prob=False,
    tie_word_embeddings=False,
  ),
  # MQA 4:1, head_dim = hidden/heads, decoder_sparse_step=2 (layer 0 dense), renorm, tied.
  "mqa_sparse_step2_tied": dict(
    num_key_value_heads=1, decoder_sparse_step=2, norm_topk_prob=True, tie_word_embeddings=True
  ),
  # MHA, 8 experts top-3, renorm, rope_theta 1e6.
  "mha_8experts_top3": dict(
    num_key_value_heads=4,
    head_dim=8,
    num_experts=8,
    num_experts_per_tok=3,
    norm_topk_prob=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
  ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_aux_loss_match_transformers(name, tmp_path):
  hf = make_hf_model(seed=len(name), **CONFIGS[name])
  hf.save_pretrained(tmp_path)
  ids = np.random.RandomState(1).randint(0, hf.config.vocab_size, (2, 11))
  ref_logits, ref_aux = hf_forward(hf, ids)
  impls = ("ragged", "blocked", "dense") if name == "gqa2_headdim12_dense_layer" else ("auto",)
  for impl in impls:
    model = from_pretrained(tmp_path, dtype=jnp.float32, moe_impl=impl)
    logits, aux = model(jnp.asarray(ids, jnp.int32))
    assert logits.shape == (2, 11, hf.config.vocab_size) and logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=1e-4, rtol=1e-4, err_msg=impl)
    np.testing.assert_allclose(float(aux), ref_aux, rtol=1e-5, err_msg=impl)


def test_padding_mask_matches_attention_mask(tmp_path):
  """segment_ids 0 = padding: logits of real tokens and the masked aux loss match HF."""
  hf = make_hf_model(seed=3)
  hf.save_pretrained(tmp_path)
  ids = np.random.RandomState(2).randint(0, 96, (2, 9))
  mask = np.ones((2, 9), np.int64)
  mask[1, 6:] = 0  # right padding
  ref_logits, ref_aux = hf_forward(hf, ids, attention_mask=mask)
  model = from_pretrained(tmp_path)
  logits, aux = model(jnp.asarray(ids, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32))
  np.testing.assert_allclose(np.asarray(logits)[0], ref_logits[0], atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(logits)[1, :6], ref_logits[1, :6], atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(float(aux), ref_aux, rtol=1e-5)
