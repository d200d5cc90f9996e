"""Tokenizers: byte-level ids and a real tokenizer.json built with `tokenizers`."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.chat.tokenizer import (
  SPECIAL_TOKENS,
  ByteTokenizer,
  HFTokenizer,
  StreamDecoder,
  load_tokenizer,
)


def test_byte_tokenizer_ids():
  tok = ByteTokenizer()
  assert tok.vocab_size == 256 + len(SPECIAL_TOKENS)
  assert tok.encode("hi") == [104, 105]
  assert tok.pad_id == tok.special_ids["<|endoftext|>"] == 256
  assert tok.eos_id == tok.special_ids["<|im_end|>"] == tok.token_id("<|im_end|>")
  ids = tok.encode("<|im_start|>user\né<tool_call>x</tool_call><|im_end|>")
  assert ids[0] == tok.special_ids["<|im_start|>"]
  assert ids[-1] == tok.eos_id
  assert "é".encode() == bytes(ids[6:8])
  assert tok.decode(ids) == "<|im_start|>user\né<tool_call>x</tool_call><|im_end|>"
  assert tok.decode(ids, skip_special=True) == "user\néx"
  assert tok.token_id("a") == 97
  with pytest.raises(KeyError, match="single token"):
    tok.token_id("ab")


def test_byte_tokenizer_decode_never_raises():
  tok = ByteTokenizer()
  assert tok.decode([0xE2, 0x82]) == "\ufffd"  # truncated UTF-8
  assert tok.decode([104, 9999, 105]) == "h\ufffdi"  # id beyond the vocabulary


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_byte_roundtrip(text):
  tok = ByteTokenizer()
  assert tok.decode(tok.encode(text)) == text


def test_stream_decoder_waits_for_whole_characters():
  tok = ByteTokenizer()
  dec = StreamDecoder(tok)
  pieces = [dec.push(i) for i in tok.encode("aé€<|im_end|>")]
  assert "".join(pieces) + dec.flush() == "aé€<|im_end|>"
  assert pieces[1] == ""  # first byte of é alone is held back


@pytest.fixture(scope="module")
def hf_tokenizer_dir(tmp_path_factory):
  """A real BPE tokenizer.json trained with `tokenizers` on a small corpus."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=list(SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  corpus = ["hello world, the quick brown fox jumps over the lazy dog"] * 50 + [
    "ls -la /tmp && cat f.txt"
  ] * 50
  tok.train_from_iterator(corpus, trainer)
  d = tmp_path_factory.mktemp("hf_tok")
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(
    json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
  )
  return d


def test_hf_tokenizer(hf_tokenizer_dir):
  from tokenizers import Tokenizer

  ref = Tokenizer.from_file(str(hf_tokenizer_dir / "tokenizer.json"))
  tok = load_tokenizer(hf_tokenizer_dir)
  assert isinstance(tok, HFTokenizer)
  text = "<|im_start|>user\nhello world<|im_end|>"
  ids = tok.encode(text)
  assert ids == ref.encode(text, add_special_tokens=False).ids
  assert ids[0] == tok.special_ids["<|im_start|>"] == ref.token_to_id("<|im_start|>")
  assert ids[-1] == tok.eos_id == ref.token_to_id("<|im_end|>")
  assert tok.pad_id == ref.token_to_id("<|endoftext|>")
  assert tok.decode(ids) == text
  assert tok.decode(ids, skip_special=True) == "user\nhello world"
  assert tok.vocab_size == ref.get_vocab_size(with_added_tokens=True)
  assert set(SPECIAL_TOKENS) <= set(tok.special_ids)
  assert tok.decode([*ids, 10**6]) == text  # out-of-vocabulary ids are dropped, not raised


def test_load_tokenizer_errors(tmp_path):
  assert isinstance(load_tokenizer("byte"), ByteTokenizer)
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(tmp_path)
