"""The chat template: Qwen3 text layout, policy mask, train/serve prefix identity."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ale.chat import parse_tool_calls
from ale.chat.template import GENERATION_PROMPT, assistant_text, render_chat, stop_token_ids
from ale.chat.tokenizer import ByteTokenizer

TOOLS = [
  {
    "type": "function",
    "function": {
      "name": "bash",
      "description": "run a command",
      "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
      },
    },
  }
]

CONVO = [
  {"role": "system", "content": "You are ROME."},
  {"role": "user", "content": "list files"},
  {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [
      {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    ],
  },
  {"role": "tool", "tool_call_id": "c0", "content": "a.txt\nb.txt"},
  {"role": "tool", "tool_call_id": "c1", "content": "second"},
  {"role": "assistant", "content": "Two files: a.txt and b.txt."},
]


def _expected_text():
  tools_json = json.dumps(TOOLS[0], ensure_ascii=False)
  return (
    "<|im_start|>system\nYou are ROME.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + tools_json
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nlist files<|im_end|>\n"
    '<|im_start|>assistant\nLet me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nTwo files: a.txt and b.txt.<|im_end|>\n"
  )


def test_qwen3_layout_and_policy_mask():
  tok = ByteTokenizer()
  r = render_chat(CONVO, tok, tools=TOOLS)
  assert r.text == _expected_text()
  assert r.token_ids == tok.encode(r.text)
  assert len(r.policy_mask) == len(r.token_ids)
  # Independent re-derivation: policy tokens are the spans after "<|im_start|>assistant\n"
  # through "<|im_end|>" inclusive.
  want = []
  head = "<|im_start|>assistant\n"
  pos = 0
  text = r.text
  while True:
    i = text.find(head, pos)
    if i < 0:
      break
    j = text.find("<|im_end|>", i) + len("<|im_end|>")
    want.append(text[i + len(head) : j])
    pos = j
  got, cur = [], []
  for t, mk in zip(r.token_ids, r.policy_mask, strict=True):
    if mk:
      cur.append(t)
    elif cur:
      got.append(tok.decode(cur))
      cur = []
  assert got == want
  # The rendered tool call is what the one parser reads back.
  parsed = parse_tool_calls(want[0].removesuffix("<|im_end|>"))
  assert parsed.ok and parsed.calls[0].name == "bash" and parsed.calls[0].arguments == {"cmd": "ls"}
  assert parsed.content == "Let me look."


def test_inference_prompt_is_prefix_of_training_render():
  tok = ByteTokenizer()
  for k in (2, 5):  # before each assistant turn
    prompt = render_chat(CONVO[:k], tok, tools=TOOLS, add_generation_prompt=True)
    assert prompt.text.endswith(GENERATION_PROMPT)
    assert sum(prompt.policy_mask) == sum(render_chat(CONVO[:k], tok, tools=TOOLS).policy_mask)
    completion = tok.encode(assistant_text(CONVO[k])) + [tok.eos_id]
    full = render_chat(CONVO[: k + 1], tok, tools=TOOLS)
    n = len(prompt.token_ids)
    assert full.token_ids[: n + len(completion)] == prompt.token_ids + completion
    assert full.policy_mask[n : n + len(completion)] == [1] * len(completion)
    assert full.policy_mask[n + len(completion)] == 0  # the newline after <|im_end|>


def test_no_tools_no_system_and_reasoning():
  tok = ByteTokenizer()
  msgs = [
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": "yo", "reasoning_content": "think"},
  ]
  r = render_chat(msgs, tok)
  assert (
    r.text
    == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nthink\n</think>\n\nyo<|im_end|>\n"
  )
  r2 = render_chat([{"role": "user", "content": "x"}], tok, tools=TOOLS)
  assert r2.text.startswith("<|im_start|>system\n# Tools")
  # tool call with no content: no leading newline; dict arguments accepted
  a = assistant_text(
    {
      "role": "assistant",
      "content": "",
      "tool_calls": [
        {"function": {"name": "f", "arguments": {"a": 1}}},
        {"name": "g", "arguments": {}},
      ],
    }
  )
  assert (
    a
    == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
  )
  assert stop_token_ids(tok) == [tok.eos_id, tok.pad_id]


def test_bad_input_errors():
  tok = ByteTokenizer()
  with pytest.raises(ValueError, match="unknown message role"):
    render_chat([{"role": "robot", "content": "x"}], tok)
  with pytest.raises(ValueError, match="'role'"):
    render_chat([{"content": "x"}], tok)
  with pytest.raises(ValueError, match="invalid tool declaration"):
    render_chat([{"role": "user", "content": "x"}], tok, tools=[{"type": "function"}])
  with pytest.raises(ValueError, match="not JSON"):
    render_chat(
      [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
      tok,
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), min_size=1, max_size=4))
def test_policy_mask_counts_assistant_tokens(turns):
  tok = ByteTokenizer()
  msgs = []
  for u, a in turns:
    msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
  r = render_chat(msgs, tok)
  assert sum(r.policy_mask) == sum(len(tok.encode(a)) + 1 for _, a in turns)
