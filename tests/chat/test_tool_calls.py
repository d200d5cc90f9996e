"""The one tool-call parser: well-formed calls parse, malformed ones become messages."""

import json

from hypothesis import given
from hypothesis import strategies as st

from ale.chat import format_tool_call, parse_tool_calls, tool_schema_error, validate_arguments


def test_parses_content_and_calls_in_order():
  text = (
    "Let me look.\n"
    + format_tool_call("bash", {"cmd": "ls"})
    + "\n"
    + format_tool_call("read_file", {"path": "a.txt"})
  )
  parsed = parse_tool_calls(text)
  assert parsed.ok
  assert parsed.content == "Let me look."
  assert [(c.name, c.arguments) for c in parsed.calls] == [
    ("bash", {"cmd": "ls"}),
    ("read_file", {"path": "a.txt"}),
  ]


def test_no_call_is_plain_content():
  parsed = parse_tool_calls("  just an answer ")
  assert parsed.ok and parsed.calls == () and parsed.content == "just an answer"


def test_string_encoded_arguments_are_accepted():
  parsed = parse_tool_calls(
    '<tool_call>{"name": "bash", "arguments": "{\\"cmd\\": \\"pwd\\"}"}</tool_call>'
  )
  assert parsed.calls[0].arguments == {"cmd": "pwd"}


def test_malformed_calls_become_errors_that_name_the_problem():
  cases = {
    "<tool_call>{not json}</tool_call>": "not valid JSON",
    "<tool_call>[1, 2]</tool_call>": "must be a JSON object",
    '<tool_call>{"arguments": {}}</tool_call>': "no 'name'",
    '<tool_call>{"name": "x", "arguments": [1]}</tool_call>': "must be a JSON object, got list",
    '<tool_call>{"name": "x", "arguments": {}': "missing its closing",
    "<tool_call>  </tool_call>": "empty",
    '<tool_call>{"name": "x", "args": {}}</tool_call>': "unknown keys",
    "done </tool_call>": "without a matching",
  }
  for text, needle in cases.items():
    parsed = parse_tool_calls(text)
    assert not parsed.ok, text
    assert needle in parsed.errors[0].message, (text, parsed.errors)


def test_validate_arguments_against_schema():
  schema = {
    "type": "object",
    "properties": {
      "cmd": {"type": "string"},
      "timeout": {"type": "integer"},
      "mode": {"enum": ["a", "b"]},
    },
    "required": ["cmd"],
    "additionalProperties": False,
  }
  call = parse_tool_calls(format_tool_call("bash", {"cmd": "ls", "timeout": 3})).calls[0]
  assert validate_arguments(call, schema) is None
  for args, needle in [
    ({}, "missing required"),
    ({"cmd": 1}, "must be string"),
    ({"cmd": "x", "timeout": True}, "must be integer"),
    ({"cmd": "x", "z": 1}, "unknown arguments"),
    ({"cmd": "x", "mode": "c"}, "must be one of"),
  ]:
    bad = parse_tool_calls(format_tool_call("bash", args)).calls[0]
    assert needle in validate_arguments(bad, schema)


def test_tool_schema_errors():
  assert (
    tool_schema_error(
      {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    )
    is None
  )
  assert "no 'function'" in tool_schema_error({"type": "function"})
  assert "'name'" in tool_schema_error({"type": "function", "function": {}})
  assert "type 'object'" in tool_schema_error(
    {"function": {"name": "f", "parameters": {"type": "array"}}}
  )


_json = st.recursive(
  st.none() | st.booleans() | st.integers() | st.text(),
  lambda c: st.lists(c) | st.dictionaries(st.text(), c),
  max_leaves=8,
)


@given(
  name=st.text(min_size=1).filter(lambda s: "</tool_call>" not in s),
  args=st.dictionaries(st.text(), _json, max_size=4),
  prefix=st.text(),
)
def test_format_then_parse_round_trips(name, args, prefix):
  prefix = prefix.replace("<tool_call>", "").replace("</tool_call>", "")
  parsed = parse_tool_calls(prefix + format_tool_call(name, args))
  assert parsed.ok and len(parsed.calls) == 1
  assert parsed.calls[0].name == name and json.dumps(
    parsed.calls[0].arguments, sort_keys=True
  ) == json.dumps(args, sort_keys=True)


def test_closing_tag_inside_an_argument_survives():
  args = {"content": "a </tool_call> b <tool_call> c"}
  parsed = parse_tool_calls(format_tool_call("write_file", args))
  assert parsed.ok and parsed.calls[0].arguments == args


@given(st.text())
def test_parser_never_raises(text):
  parse_tool_calls(text)
