"""The one tool-call format and parser (Qwen3 style).

A model asks for a tool by writing, anywhere in its completion::

    <tool_call>
    {"name": "bash", "arguments": {"cmd": "ls"}}
    </tool_call>

Every package that produces or consumes tool calls (the chat template, the inference
server, the environments, the agents) imports this module, so training and serving see
exactly the same text (paper: the context seen in training is the one seen in
production, M5).

Parsing never raises on model output: a malformed call becomes a `ToolCallError` whose
`message` says exactly what was wrong, so an environment can return it to the model as an
observation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_BLOCK = re.compile(
  re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S
)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed tool call: a tool name and its JSON-object arguments."""

  name: str
  arguments: dict[str, Any]
  id: str | None = None

  def to_json(self) -> str:
    return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)

  def to_openai(self, index: int = 0) -> dict[str, Any]:
    """The OpenAI `tool_calls[i]` entry for this call."""
    return {
      "id": self.id or f"call_{index}",
      "type": "function",
      "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
    }


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """A tool call the model attempted but wrote wrongly; `message` is shown to the model."""

  message: str
  raw: str


@dataclasses.dataclass(frozen=True)
class ParsedCompletion:
  """A completion split into free text and tool calls.

  `content` is the text outside `<tool_call>` blocks (stripped); `calls` the well-formed
  calls in order; `errors` one entry per malformed block.
  """

  content: str
  calls: tuple[ToolCall, ...]
  errors: tuple[ToolCallError, ...]

  @property
  def ok(self) -> bool:
    return not self.errors


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
  """Renders one call exactly as the model is trained to write it."""
  body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
  # A closing tag inside a string would end the block early; `\/` is a valid JSON escape.
  body = body.replace(TOOL_CALL_CLOSE, "<\\/tool_call>")
  return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _parse_block(raw: str, closed: bool) -> ToolCall | ToolCallError:
  if not closed:
    return ToolCallError(f"tool call is missing its closing {TOOL_CALL_CLOSE} tag", raw)
  body = raw.strip()
  if not body:
    return ToolCallError(
      "tool call is empty; expected a JSON object with 'name' and 'arguments'", raw
    )
  try:
    obj = json.loads(body)
  except json.JSONDecodeError as e:
    return ToolCallError(
      f"tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", raw
    )
  if not isinstance(obj, dict):
    return ToolCallError(f"tool call must be a JSON object, got {type(obj).__name__}", raw)
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return ToolCallError("tool call has no 'name' string", raw)
  args = obj.get("arguments", {})
  if isinstance(args, str):  # some models double-encode the arguments
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError as e:
      return ToolCallError(
        f"'arguments' of tool '{name}' is a string that is not JSON ({e.msg})", raw
      )
  if not isinstance(args, dict):
    return ToolCallError(
      f"'arguments' of tool '{name}' must be a JSON object, got {type(args).__name__}", raw
    )
  extra = sorted(set(obj) - {"name", "arguments"})
  if extra:
    return ToolCallError(
      f"tool call has unknown keys {extra}; expected only 'name' and 'arguments'", raw
    )
  return ToolCall(name=name, arguments=args)


def parse_tool_calls(text: str) -> ParsedCompletion:
  """Splits a completion into content, well-formed calls and errors. Never raises."""
  calls: list[ToolCall] = []
  errors: list[ToolCallError] = []
  pieces: list[str] = []
  pos = 0
  for m in _BLOCK.finditer(text):
    pieces.append(text[pos : m.start()])
    pos = m.end()
    parsed = _parse_block(m.group(1), closed=bool(m.group(2)))
    (calls if isinstance(parsed, ToolCall) else errors).append(parsed)
  pieces.append(text[pos:])
  content = "".join(pieces)
  if TOOL_CALL_CLOSE in content:
    errors.append(
      ToolCallError(f"found {TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}", text)
    )
    content = content.replace(TOOL_CALL_CLOSE, "")
  return ParsedCompletion(content=content.strip(), calls=tuple(calls), errors=tuple(errors))


def validate_arguments(call: ToolCall, schema: Mapping[str, Any]) -> str | None:
  """Checks `call.arguments` against a JSON-schema `parameters` object (the subset tools use).

  Returns None when valid, else a message naming the problem (shown to the model).
  Supports `required`, `properties` with `type` (string, integer, number, boolean, array,
  object) and `enum`, and `additionalProperties: false`.
  """
  props: Mapping[str, Any] = schema.get("properties", {}) or {}
  for key in schema.get("required", []) or []:
    if key not in call.arguments:
      return f"tool '{call.name}' is missing required argument '{key}'"
  if schema.get("additionalProperties") is False:
    unknown = sorted(set(call.arguments) - set(props))
    if unknown:
      return f"tool '{call.name}' got unknown arguments {unknown}; it accepts {sorted(props)}"
  types = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
  }
  for key, value in call.arguments.items():
    spec = props.get(key)
    if not spec:
      continue
    want = spec.get("type")
    if want in types:
      ok = isinstance(value, types[want]) and not (
        want in ("integer", "number") and isinstance(value, bool)
      )
      if not ok:
        return f"argument '{key}' of tool '{call.name}' must be {want}, got {type(value).__name__}"
    if "enum" in spec and value not in spec["enum"]:
      return f"argument '{key}' of tool '{call.name}' must be one of {spec['enum']}, got {value!r}"
  return None


def tool_schema_error(tool: Any) -> str | None:
  """Checks one OpenAI-style tool declaration; returns a message or None when valid."""
  if not isinstance(tool, Mapping):
    return "each tool must be an object"
  if tool.get("type", "function") != "function":
    return f"tool type must be 'function', got {tool.get('type')!r}"
  fn = tool.get("function")
  if not isinstance(fn, Mapping):
    return "tool has no 'function' object"
  if not isinstance(fn.get("name"), str) or not fn.get("name"):
    return "tool function has no 'name' string"
  params = fn.get("parameters", {"type": "object"})
  if not isinstance(params, Mapping):
    return f"parameters of tool '{fn['name']}' must be a JSON-schema object"
  if params.get("type", "object") != "object":
    return f"parameters of tool '{fn['name']}' must have type 'object'"
  return None


def tools_by_name(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
  """Maps tool name -> its `parameters` schema, for OpenAI-style tool lists."""
  out = {}
  for t in tools:
    fn = t.get("function", t)
    out[fn["name"]] = fn.get("parameters", {"type": "object"})
  return out
