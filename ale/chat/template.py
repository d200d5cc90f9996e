"""The one chat template (Qwen3-style ChatML), for training and for inference alike.

    <|im_start|>system
    {system}{tools block}<|im_end|>
    <|im_start|>user
    {content}<|im_end|>
    <|im_start|>assistant
    {content}
    <tool_call>
    {"name": ..., "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {tool result}
    </tool_response><|im_end|>
    <|im_start|>assistant

Tool results (role "tool") are grouped into one user turn, as in Qwen3's template.
The text is tokenized piece by piece (headers, contents, footers) and the ids
concatenated, so a prompt rendered for inference is exactly a prefix of the same
conversation rendered for training (the paper's requirement that the context seen in
training is the one seen in serving). `policy_mask` is 1 exactly on assistant
completion tokens: everything after `<|im_start|>assistant\\n` up to and including
`<|im_end|>` (the `policy_mask` of ale.ipa). A completion ends at `<|im_end|>`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from ale.chat.tokenizer import Tokenizer
from ale.chat.tool_calls import format_tool_call, tool_schema_error

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
STOP_TOKENS: tuple[str, ...] = (IM_END, "<|endoftext|>")
GENERATION_PROMPT = f"{IM_START}assistant\n"

_TOOLS_HEADER = (
  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
  "\n</tools>\n\nFor each function call, return a json object with function name and "
  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
  '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclasses.dataclass(frozen=True)
class RenderedChat:
  """`token_ids [T]`, `policy_mask [T]` (1 on assistant completion tokens), and the text."""

  token_ids: list[int]
  policy_mask: list[int]
  text: str

  def __len__(self) -> int:
    return len(self.token_ids)


def _content_text(content: Any) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # OpenAI content parts
    return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
  return json.dumps(content, ensure_ascii=False)


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
  """The tools block appended to the system message (one JSON signature per line)."""
  for t in tools:
    err = tool_schema_error(t)
    if err:
      raise ValueError(f"invalid tool declaration: {err}")
  lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
  return _TOOLS_HEADER + lines + _TOOLS_FOOTER


def _tool_call_text(call: Mapping[str, Any]) -> str:
  fn = call.get("function", call)
  if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
    raise ValueError(f"assistant tool_calls entry has no function name: {call!r}")
  args = fn.get("arguments", {})
  if isinstance(args, str):
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError as e:
      raise ValueError(f"arguments of tool call {fn['name']!r} are not JSON ({e.msg})") from e
  if not isinstance(args, Mapping):
    raise ValueError(f"arguments of tool call {fn['name']!r} must be a JSON object")
  return format_tool_call(fn["name"], args)


def assistant_text(message: Mapping[str, Any]) -> str:
  """An assistant message's completion text (without the trailing `<|im_end|>`)."""
  text = _content_text(message.get("content"))
  reasoning = message.get("reasoning_content")
  if reasoning:
    text = f"<think>\n{reasoning.strip()}\n</think>\n\n{text.lstrip()}"
  for i, call in enumerate(message.get("tool_calls") or []):
    if text or i:
      text += "\n"
    text += _tool_call_text(call)
  return text


def render_chat(
  messages: Sequence[Mapping[str, Any]],
  tokenizer: Tokenizer,
  tools: Sequence[Mapping[str, Any]] | None = None,
  add_generation_prompt: bool = False,
) -> RenderedChat:
  """Renders OpenAI-style messages (roles system/user/assistant/tool) to token ids.

  Args:
    messages: dicts with `role` and `content`; assistant messages may carry
      `tool_calls` (OpenAI format, arguments as a JSON string or an object) and
      `reasoning_content`.
    tokenizer: a `ByteTokenizer` or `HFTokenizer`.
    tools: OpenAI-style tool declarations, listed in the system turn.
    add_generation_prompt: end with `<|im_start|>assistant\\n` for the model to continue.
  Returns:
    RenderedChat with `policy_mask` 1 on assistant completion tokens incl. `<|im_end|>`.
  """
  ids: list[int] = []
  mask: list[int] = []
  text: list[str] = []

  def emit(s: str, policy: int = 0):
    if not s:
      return
    toks = tokenizer.encode(s)
    ids.extend(toks)
    mask.extend([policy] * len(toks))
    text.append(s)

  msgs = list(messages)
  for m in msgs:
    if not isinstance(m, Mapping) or "role" not in m:
      raise ValueError(f"each message must be a dict with a 'role', got {m!r}")
  if tools:
    tblock = tools_text(tools)
    if msgs and msgs[0]["role"] == "system":
      emit(f"{IM_START}system\n")
      emit(f"{_content_text(msgs[0].get('content'))}\n\n{tblock}")
      emit(f"{IM_END}\n")
      msgs = msgs[1:]
    else:
      emit(f"{IM_START}system\n")
      emit(tblock)
      emit(f"{IM_END}\n")
  for i, m in enumerate(msgs):
    role = m["role"]
    if role in ("system", "user"):
      emit(f"{IM_START}{role}\n")
      emit(_content_text(m.get("content")))
      emit(f"{IM_END}\n")
    elif role == "assistant":
      emit(f"{IM_START}assistant\n")
      emit(assistant_text(m), policy=1)
      emit(IM_END, policy=1)
      emit("\n")
    elif role == "tool":
      if i == 0 or msgs[i - 1]["role"] != "tool":
        emit(f"{IM_START}user")
      emit("\n<tool_response>\n")
      emit(_content_text(m.get("content")))
      emit("\n</tool_response>")
      if i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool":
        emit(f"{IM_END}\n")
    else:
      raise ValueError(f"unknown message role {role!r}; expected system, user, assistant or tool")
  if add_generation_prompt:
    emit(GENERATION_PROMPT)
  return RenderedChat(token_ids=ids, policy_mask=mask, text="".join(text))


def stop_token_ids(tokenizer: Tokenizer) -> list[int]:
  """Ids that end a completion (`<|im_end|>`, and `<|endoftext|>` when present)."""
  out = [tokenizer.eos_id]
  for s in STOP_TOKENS:
    i = tokenizer.special_ids.get(s)
    if i is not None and i not in out:
      out.append(i)
  return out
