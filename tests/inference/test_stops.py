"""Incremental detokenisation and stop strings."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ale.chat.tokenizer import ByteTokenizer
from ale.inference.stops import CompletionText

TOK = ByteTokenizer()


def run(text, stop):
  ct = CompletionText(lambda ids: TOK.decode(ids), stop)
  shown = ""
  for t in TOK.encode(text):
    shown += ct.push(t)
    if ct.stopped:
      break
  if not ct.stopped:
    shown += ct.finish()
  return ct, shown


def test_stop_string_cuts_the_text_and_never_leaks():
  ct, shown = run("hello END world", ["END"])
  assert ct.stopped and ct.stop_string == "END"
  assert ct.text == shown == "hello "


def test_held_back_prefix_is_released_when_it_is_not_a_stop():
  ct = CompletionText(lambda ids: TOK.decode(ids), ["ENDX"])
  out = [ct.push(t) for t in TOK.encode("aEND")]
  assert "".join(out) == "a"  # "END" might still become "ENDX"
  assert ct.push(ord("y")) == "ENDy"


def test_multibyte_characters_are_not_split():
  ct = CompletionText(lambda ids: TOK.decode(ids), [])
  pieces = [ct.push(t) for t in "é漢".encode()]
  assert all("\ufffd" not in p for p in pieces)
  assert "".join(pieces) == "é漢"


def test_earliest_stop_wins():
  ct, shown = run("abc||def;;", [";;", "||"])
  assert ct.stop_string == "||" and shown == "abc"


@settings(max_examples=60, deadline=None)
@given(
  text=st.text(alphabet="ab;é\n", max_size=30),
  stop=st.lists(st.text(alphabet="ab;é", min_size=1, max_size=3), max_size=2),
)
def test_streamed_text_is_the_final_text_and_matches_str_find(text, stop):
  ct, shown = run(text, stop)
  assert shown == ct.text
  hits = [i for s in stop if (i := text.find(s)) >= 0]
  assert ct.text == (text[: min(hits)] if hits else text)
