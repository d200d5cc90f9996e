"""OpenAI-compatible HTTP server over the continuous-batching orchestrator (aiohttp).

Every agent talks to the policy over this API (native agent mode, M5), so chat is
rendered with the library's one chat template (`ale.chat.template.render_chat`) and
tool calls are parsed with its one parser (`ale.chat.parse_tool_calls`): the context
seen in training is the one seen in serving.

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text).

Beyond the OpenAI schema, responses carry what RL needs (extra fields, ignored by the
`openai` client but readable from `response.model_extra`):

* top level: `prompt_token_ids` (what the model saw) and `policy_versions`;
* each choice: `token_ids` (every sampled token, a final stop token included),
  `token_logprobs` (log μ of each, the sampling distribution actually used),
  `raw_logprobs` (log-prob under the raw model), `policy_versions`,
  `tool_call_errors` (parser messages for malformed tool calls).

Sampling defaults are the paper's (temperature 0.7, top-p 0.8, top-k 20) for any field
the request leaves out; `top_k` is an extra request field (0 or -1 disables it).

Bad input gets a 4xx with an OpenAI-style `{"error": {"message": ...}}` body; a full
queue gets 429; the server keeps serving everyone else.

Run: `ale-serve --preset tiny --port 8000` or `ale-serve --checkpoint DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import secrets
import time
from typing import Any, Sequence

from aiohttp import web

from ale.chat import parse_tool_calls, tool_schema_error
from ale.inference import sampling as sampling_lib
from ale.inference.engine import Engine, SamplingParams
from ale.inference.orchestrator import Completion, Orchestrator, QueueFull, Request, RequestHandle

log = logging.getLogger(__name__)

MAX_N = 16
MAX_STOP = 16
_ROLES = ("system", "user", "assistant", "tool")


class BadRequest(Exception):
  """A client error: `status` and a message naming the problem."""

  def __init__(
    self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
  ):
    super().__init__(message)
    self.status, self.param, self.code = status, param, code


def _error(
  status: int, message: str, *, param: str | None = None, code: str | None = None
) -> web.Response:
  kind = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
  }.get(status, "server_error")
  body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
  return web.json_response(body, status=status)


# ---------------------------------------------------------------------------- parsing
def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
  v = body.get(name)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise BadRequest(f"'{name}' must be a number, got {v!r}", param=name)
  if not lo <= v <= hi:
    raise BadRequest(f"'{name}' must be in [{lo}, {hi}], got {v}", param=name)
  return float(v)


def _integer(
  body: dict, name: str, default: int | None, lo: int, hi: int | None = None
) -> int | None:
  v = body.get(name)
  if v is None:
    return default
  if isinstance(v, bool) or not isinstance(v, int):
    raise BadRequest(f"'{name}' must be an integer, got {v!r}", param=name)
  if v < lo or (hi is not None and v > hi):
    raise BadRequest(
      f"'{name}' must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}", param=name
    )
  return v


def _bool(body: dict, name: str, default: bool) -> bool:
  v = body.get(name, default)
  if v is None:
    return default
  if not isinstance(v, bool):
    raise BadRequest(f"'{name}' must be true or false, got {v!r}", param=name)
  return v


def _stop_strings(body: dict) -> list[str]:
  stop = body.get("stop")
  if stop is None:
    return []
  if isinstance(stop, str):
    stop = [stop]
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
    raise BadRequest("'stop' must be a string or a list of strings", param="stop")
  if len(stop) > MAX_STOP:
    raise BadRequest(
      f"'stop' has {len(stop)} strings; at most {MAX_STOP} are allowed", param="stop"
    )
  return [s for s in stop if s]


def _message_text(content: Any, where: str) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # OpenAI content parts; only text is supported
    parts = []
    for p in content:
      if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
        raise BadRequest(f"{where}: only text content parts are supported", param="messages")
      parts.append(p["text"])
    return "".join(parts)
  raise BadRequest(f"{where}: 'content' must be a string or a list of text parts", param="messages")


def _messages(body: dict) -> list[dict]:
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise BadRequest("'messages' must be a non-empty list of message objects", param="messages")
  out = []
  for i, m in enumerate(msgs):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise BadRequest(f"{where} must be an object", param="messages")
    role = m.get("role")
    if role == "developer":
      role = "system"
    if role not in _ROLES:
      raise BadRequest(
        f"{where} has role {role!r}; expected one of {list(_ROLES)}", param="messages"
      )
    msg = dict(m, role=role, content=_message_text(m.get("content"), where))
    calls = m.get("tool_calls")
    if calls is not None:
      if role != "assistant" or not isinstance(calls, list):
        raise BadRequest(
          f"{where}: 'tool_calls' must be a list on an assistant message", param="messages"
        )
      fixed = []
      for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
          raise BadRequest(
            f"{where}: each tool call needs a 'function' with a 'name'", param="messages"
          )
        args = fn.get("arguments", {})
        if isinstance(args, str):
          try:
            args = json.loads(args) if args.strip() else {}
          except json.JSONDecodeError as e:
            raise BadRequest(
              f"{where}: tool call arguments are not valid JSON ({e.msg})", param="messages"
            ) from None
        fixed.append(dict(c, function=dict(fn, arguments=args)))
      msg["tool_calls"] = fixed
    out.append(msg)
  return out


def _tools(body: dict) -> list[dict] | None:
  tools = body.get("tools")
  if tools is None:
    return None
  if not isinstance(tools, list):
    raise BadRequest("'tools' must be a list of tool objects", param="tools")
  for i, t in enumerate(tools):
    err = tool_schema_error(t)
    if err:
      raise BadRequest(f"tools[{i}]: {err}", param="tools")
  if body.get("tool_choice") == "none":
    return None
  return tools or None


# ---------------------------------------------------------------------------- server
class Server:
  """The aiohttp application around an `Orchestrator` and a tokenizer.

  Args:
    orchestrator: serves the requests (started and closed with the app).
    tokenizer: `encode`, `decode(ids, skip_special=False)`, `eos_id`, `special_ids`.
    model_name: the `model` id clients must ask for.
    default_max_tokens: completion budget when a request gives none (capped by context).
  """

  def __init__(
    self,
    orchestrator: Orchestrator,
    tokenizer: Any,
    model_name: str,
    *,
    default_max_tokens: int = 1024,
  ):
    self.orch = orchestrator
    self.tok = tokenizer
    self.model_name = model_name
    self.default_max_tokens = default_max_tokens
    self.created = int(time.time())
    self.http_errors: dict[int, int] = {}
    self.http_requests = 0
    self.app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
    self.app.add_routes(
      [
        web.post("/v1/chat/completions", self.chat_completions),
        web.post("/v1/completions", self.completions),
        web.get("/v1/models", self.models),
        web.get("/v1/models/{model}", self.model_info),
        web.get("/health", self.health),
        web.get("/metrics", self.metrics),
      ]
    )
    self.app.on_startup.append(self._start)
    self.app.on_cleanup.append(self._stop)

  async def _start(self, _app) -> None:
    await self.orch.start()

  async def _stop(self, _app) -> None:
    await self.orch.close()

  @web.middleware
  async def _errors(self, request: web.Request, handler):
    self.http_requests += 1
    try:
      resp = await handler(request)
    except BadRequest as e:
      resp = _error(e.status, str(e), param=e.param, code=e.code)
    except QueueFull as e:
      resp = _error(429, f"server is busy: {e}; retry later")
    except web.HTTPException as e:
      resp = _error(e.status, e.reason or "error") if e.status >= 400 else None
      if resp is None:
        raise
    except (ConnectionResetError, asyncio.CancelledError):
      raise
    except Exception as e:  # a bug: report it, keep serving
      log.exception("request failed")
      resp = _error(500, f"internal error: {type(e).__name__}: {e}")
    if resp.status >= 400:
      self.http_errors[resp.status] = self.http_errors.get(resp.status, 0) + 1
    return resp

  # ------------------------------------------------------------------ simple endpoints
  async def health(self, request: web.Request) -> web.Response:
    return web.json_response(
      {
        "status": "ok",
        "model": self.model_name,
        "policy_version": self.orch.version,
        "active_slots": self.orch.active_slots,
        "queue_depth": self.orch.queue_depth,
      }
    )

  def _model_card(self) -> dict:
    return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "ale"}

  async def models(self, request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [self._model_card()]})

  async def model_info(self, request: web.Request) -> web.Response:
    name = request.match_info["model"]
    if name != self.model_name:
      raise BadRequest(
        f"model {name!r} does not exist; this server serves {self.model_name!r}", status=404
      )
    return web.json_response(self._model_card())

  async def metrics(self, request: web.Request) -> web.Response:
    s, o = self.orch.stats, self.orch
    eng = o.engine
    rows = [
      (
        "ale_requests_submitted_total",
        "counter",
        "Requests accepted into the queue.",
        s.requests_submitted,
      ),
      (
        "ale_requests_finished_total",
        "counter",
        "Requests that finished generating.",
        s.requests_finished,
      ),
      (
        "ale_requests_rejected_total",
        "counter",
        "Requests refused because the queue was full.",
        s.requests_rejected,
      ),
      ("ale_prompt_tokens_total", "counter", "Prompt tokens prefilled.", s.prompt_tokens),
      ("ale_generated_tokens_total", "counter", "Completion tokens sampled.", s.generated_tokens),
      ("ale_generate_steps_total", "counter", "Batched generate steps.", s.generate_steps),
      ("ale_prefills_total", "counter", "Prefill calls.", s.prefills),
      (
        "ale_generate_step_seconds_total",
        "counter",
        "Time spent in generate steps.",
        s.step_seconds,
      ),
      ("ale_weight_updates_total", "counter", "Weight updates applied.", s.weight_updates),
      ("ale_http_requests_total", "counter", "HTTP requests received.", self.http_requests),
      ("ale_queue_depth", "gauge", "Requests waiting for a decode slot.", o.queue_depth),
      ("ale_active_slots", "gauge", "Decode slots in use.", o.active_slots),
      ("ale_max_concurrent_decodes", "gauge", "Decode slots.", eng.max_concurrent_decodes),
      ("ale_policy_version", "gauge", "Policy version of the current weights.", o.version),
    ]
    lines = []
    for name, kind, help_, value in rows:
      lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
    lines += [
      "# HELP ale_http_errors_total HTTP error responses by status.",
      "# TYPE ale_http_errors_total counter",
    ]
    for status, count in sorted(self.http_errors.items()):
      lines.append(f'ale_http_errors_total{{status="{status}"}} {count}')
    for name, count in sorted(eng.compiled_programs().items()):
      lines.append(f'ale_compiled_programs{{program="{name}"}} {count}')
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

  # ------------------------------------------------------------------ request plumbing
  async def _json(self, request: web.Request) -> dict:
    try:
      body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
      raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != self.model_name:
      raise BadRequest(
        f"model {model!r} does not exist; this server serves {self.model_name!r}",
        status=404,
        param="model",
        code="model_not_found",
      )
    return body

  def _requests(self, body: dict, prompt_ids: list[int]) -> list[Request]:
    """Validates the sampling fields and builds the `n` token-space requests."""
    n = _integer(body, "n", 1, 1, MAX_N)
    temperature = _number(body, "temperature", sampling_lib.PAPER_TEMPERATURE, 0.0, 2.0)
    top_p = _number(body, "top_p", sampling_lib.PAPER_TOP_P, 0.0, 1.0)
    if top_p <= 0:
      raise BadRequest("'top_p' must be > 0", param="top_p")
    top_k = _integer(body, "top_k", sampling_lib.PAPER_TOP_K, -1)
    top_k = max(top_k, 0)
    seed = _integer(body, "seed", None, -(2**63), 2**64 - 1)
    eng = self.orch.engine
    room = eng.max_seq_len - len(prompt_ids)
    if len(prompt_ids) > eng.max_prefill_length or room < 1:
      raise BadRequest(
        f"prompt has {len(prompt_ids)} tokens but this model's context allows at most "
        f"{min(eng.max_prefill_length, eng.max_seq_len - 1)}; shorten the prompt",
        param="messages" if "messages" in body else "prompt",
        code="context_length_exceeded",
      )
    max_tokens = _integer(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
      max_tokens = _integer(body, "max_tokens", None, 1)
    if max_tokens is None:
      max_tokens = min(self.default_max_tokens, room)
    elif max_tokens > room:
      raise BadRequest(
        f"max_tokens={max_tokens} plus the prompt's {len(prompt_ids)} tokens exceeds the context "
        f"length {eng.max_seq_len}; ask for at most {room}",
        param="max_tokens",
        code="context_length_exceeded",
      )
    stop = _stop_strings(body)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
      isinstance(t, int) and not isinstance(t, bool) for t in stop_ids
    ):
      raise BadRequest("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    ignore_eos = _bool(body, "ignore_eos", False)
    base = seed if seed is not None else secrets.randbits(62)
    reqs = []
    for i in range(n):
      sp = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, seed=(base + i) % 2**63
      )
      reqs.append(
        Request(
          prompt_ids=prompt_ids,
          sampling=sp,
          max_tokens=max_tokens,
          stop=stop,
          stop_token_ids=stop_ids,
          ignore_eos=ignore_eos,
        )
      )
    for r in reqs:
      try:
        self.orch.validate(r)
      except ValueError as e:
        raise BadRequest(str(e)) from None
    return reqs

  def _submit(self, reqs: Sequence[Request]) -> list[RequestHandle]:
    if self.orch.queue_depth + len(reqs) > self.orch.max_queue:
      self.orch.stats.requests_rejected += len(reqs)
      raise QueueFull(f"{self.orch.queue_depth} requests waiting (max_queue={self.orch.max_queue})")
    return [self.orch.submit(r) for r in reqs]

  def _token_str(self, tid: int) -> str:
    return self.tok.decode([tid], skip_special=False)

  def _visible(self, c: Completion) -> list[int]:
    """Completion token indices that belong to the text (a final stop token does not)."""
    n = len(c.token_ids)
    if c.finish_reason == "stop" and isinstance(c.stop_reason, int):
      n -= 1
    return list(range(n))

  def _extras(self, c: Completion) -> dict:
    return {
      "token_ids": c.token_ids,
      "token_logprobs": c.logprobs,
      "raw_logprobs": c.raw_logprobs,
      "policy_versions": c.policy_versions,
      "stop_reason": c.stop_reason,
    }

  # ------------------------------------------------------------------ chat
  async def chat_completions(self, request: web.Request) -> web.StreamResponse:
    body = await self._json(request)
    messages = _messages(body)
    tools = _tools(body)
    want_logprobs = _bool(body, "logprobs", False)
    top_logprobs = _integer(body, "top_logprobs", 0, 0, 20)
    if top_logprobs:
      raise BadRequest(
        "'top_logprobs' > 0 is not supported by this server; use 0", param="top_logprobs"
      )
    stream = _bool(body, "stream", False)
    from ale.chat.template import render_chat  # noqa: PLC0415

    try:
      rendered = render_chat(messages, self.tok, tools=tools, add_generation_prompt=True)
    except (ValueError, TypeError, KeyError) as e:
      raise BadRequest(f"cannot render these messages: {e}", param="messages") from None
    prompt_ids = list(rendered.token_ids)
    reqs = self._requests(body, prompt_ids)
    handles = self._submit(reqs)
    rid = f"chatcmpl-{secrets.token_hex(12)}"
    try:
      if stream:
        return await self._chat_stream(
          request, body, rid, handles, tools is not None, want_logprobs
        )
      results = await asyncio.gather(*(h.result() for h in handles))
    finally:
      for h in handles:
        h.cancel()
    choices = []
    for i, c in enumerate(results):
      if c.finish_reason == "error":
        raise RuntimeError(f"generation failed: {c.error}")
      msg, finish, errors = self._chat_message(c, tools is not None)
      choice = {"index": i, "message": msg, "finish_reason": finish, "logprobs": None}
      if want_logprobs:
        choice["logprobs"] = {"content": [self._lp_entry(c, j) for j in self._visible(c)]}
      choice.update(self._extras(c), tool_call_errors=errors)
      choices.append(choice)
    return web.json_response(
      {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": self.model_name,
        "choices": choices,
        "usage": self._usage(prompt_ids, results),
        "prompt_token_ids": prompt_ids,
        "policy_versions": sorted({v for c in results for v in c.policy_versions}),
      }
    )

  def _lp_entry(self, c: Completion, j: int) -> dict:
    s = self._token_str(c.token_ids[j])
    return {
      "token": s,
      "logprob": c.logprobs[j],
      "bytes": list(s.encode("utf-8")),
      "top_logprobs": [],
    }

  def _usage(self, prompt_ids: list[int], results: Sequence[Completion]) -> dict:
    done = sum(len(c.token_ids) for c in results)
    return {
      "prompt_tokens": len(prompt_ids),
      "completion_tokens": done,
      "total_tokens": len(prompt_ids) + done,
    }

  def _chat_message(self, c: Completion, with_tools: bool) -> tuple[dict, str, list[str]]:
    finish = "stop" if c.finish_reason in ("stop", "abort") else c.finish_reason
    if not with_tools:
      return {"role": "assistant", "content": c.text}, finish, []
    parsed = parse_tool_calls(c.text)
    errors = [e.message for e in parsed.errors]
    if errors or not parsed.calls:  # malformed calls: hand back the text as written
      return {"role": "assistant", "content": c.text}, finish, errors
    calls = [
      dict(call.to_openai(k), id=f"call_{secrets.token_hex(8)}")
      for k, call in enumerate(parsed.calls)
    ]
    msg = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
    return msg, ("tool_calls" if finish == "stop" else finish), errors

  async def _chat_stream(
    self, request, body, rid, handles, with_tools, want_logprobs
  ) -> web.StreamResponse:
    resp = web.StreamResponse(
      headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    created = int(time.time())
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(i: int, delta: dict, finish=None, logprobs=None, **extra) -> bytes:
      obj = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": self.model_name,
        "choices": [
          {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **extra}
        ],
      }
      return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def one(i: int, h: RequestHandle, out: asyncio.Queue):
      await out.put(chunk(i, {"role": "assistant", "content": ""}))
      shown = ""  # content already streamed
      held = ""  # text not yet streamed (may hold a tool call)
      async for ev in h:
        lp = None
        if want_logprobs and ev.token_id not in h._stop_ids:
          s = self._token_str(ev.token_id)
          lp = {
            "content": [
              {"token": s, "logprob": ev.logprob, "bytes": list(s.encode()), "top_logprobs": []}
            ]
          }
        held += ev.text
        emit = held
        if with_tools:  # stream text up to where a tool call may begin
          k = held.find("<tool_call>")
          if k < 0:
            k = _partial_suffix(held, "<tool_call>")
          emit = held[:k]
        held = held[len(emit) :]
        shown += emit
        extra = {
          "token_ids": [ev.token_id],
          "token_logprobs": [ev.logprob],
          "raw_logprobs": [ev.raw_logprob],
          "policy_versions": [ev.version],
        }
        await out.put(chunk(i, {"content": emit} if emit else {}, None, lp, **extra))
      c = await h.result()
      msg, finish, errors = self._chat_message(c, with_tools)
      delta: dict[str, Any] = {}
      content = msg.get("content") or ""
      rest = content[len(shown) :] if content.startswith(shown) else ""
      if rest:
        delta["content"] = rest
      if msg.get("tool_calls"):
        delta["tool_calls"] = [dict(tc, index=k) for k, tc in enumerate(msg["tool_calls"])]
      await out.put(
        chunk(i, delta, finish, None, policy_versions=c.policy_versions, tool_call_errors=errors)
      )
      return c

    out: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(one(i, h, out)) for i, h in enumerate(handles)]
    waiter = asyncio.gather(*tasks)
    try:
      while not (waiter.done() and out.empty()):
        get = asyncio.create_task(out.get())
        done, _ = await asyncio.wait({get, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
          await resp.write(get.result())
        else:
          get.cancel()
      results = waiter.result()
      if include_usage:
        usage = {
          "id": rid,
          "object": "chat.completion.chunk",
          "created": created,
          "model": self.model_name,
          "choices": [],
          "usage": self._usage(handles[0].request.prompt_ids, results),
          "prompt_token_ids": list(handles[0].request.prompt_ids),
        }
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
      await resp.write(b"data: [DONE]\n\n")
    finally:
      for t in tasks:
        t.cancel()
    await resp.write_eof()
    return resp

  # ------------------------------------------------------------------ completions
  def _prompts(self, body: dict) -> list[list[int]]:
    p = body.get("prompt")
    vocab = self.orch.vocab_size

    def ids(x) -> list[int]:
      if isinstance(x, str):
        return list(self.tok.encode(x))
      if isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        if vocab is not None and any(not 0 <= t < vocab for t in x):
          raise BadRequest(f"'prompt' has token ids outside [0, {vocab})", param="prompt")
        return list(x)
      raise BadRequest(
        "'prompt' must be a string, a list of token ids, or a list of those", param="prompt"
      )

    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
      prompts = [ids(x) for x in p]
    else:
      prompts = [ids(p)]
    if any(not x for x in prompts):
      raise BadRequest("'prompt' is empty; send at least one token", param="prompt")
    return prompts

  async def completions(self, request: web.Request) -> web.StreamResponse:
    body = await self._json(request)
    if _bool(body, "echo", False):
      raise BadRequest("'echo' is not supported by this server", param="echo")
    want = _integer(body, "logprobs", None, 0, 5)
    stream = _bool(body, "stream", False)
    prompts = self._prompts(body)
    plan = [(p, self._requests(body, p)) for p in prompts]
    handles = self._submit([r for _, rs in plan for r in rs])
    rid = f"cmpl-{secrets.token_hex(12)}"
    try:
      if stream:
        return await self._completions_stream(request, rid, handles, want is not None)
      results = await asyncio.gather(*(h.result() for h in handles))
    finally:
      for h in handles:
        h.cancel()
    choices = []
    for i, c in enumerate(results):
      if c.finish_reason == "error":
        raise RuntimeError(f"generation failed: {c.error}")
      lp = None
      if want is not None:
        vis = self._visible(c)
        toks = [self._token_str(c.token_ids[j]) for j in vis]
        offsets, pos = [], 0
        for s in toks:
          offsets.append(pos)
          pos += len(s)
        lp = {
          "tokens": toks,
          "token_logprobs": [c.logprobs[j] for j in vis],
          "top_logprobs": None,
          "text_offset": offsets,
        }
      finish = "stop" if c.finish_reason == "abort" else c.finish_reason
      choices.append(
        {
          "index": i,
          "text": c.text,
          "logprobs": lp,
          "finish_reason": finish,
          **self._extras(c),
          "prompt_token_ids": c.prompt_ids,
        }
      )
    n_prompt = sum(len(p) * len(rs) for p, rs in plan) // max(1, len(plan[0][1]))
    done = sum(len(c.token_ids) for c in results)
    return web.json_response(
      {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": self.model_name,
        "choices": choices,
        "usage": {
          "prompt_tokens": n_prompt,
          "completion_tokens": done,
          "total_tokens": n_prompt + done,
        },
        "policy_versions": sorted({v for c in results for v in c.policy_versions}),
      }
    )

  async def _completions_stream(self, request, rid, handles, want_logprobs) -> web.StreamResponse:
    resp = web.StreamResponse(
      headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    created = int(time.time())
    out: asyncio.Queue = asyncio.Queue()

    def chunk(i, text, finish=None, lp=None, **extra) -> bytes:
      obj = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": self.model_name,
        "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish, **extra}],
      }
      return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def one(i, h):
      async for ev in h:
        lp = None
        if want_logprobs and ev.token_id not in h._stop_ids:
          s = self._token_str(ev.token_id)
          lp = {
            "tokens": [s],
            "token_logprobs": [ev.logprob],
            "top_logprobs": None,
            "text_offset": [0],
          }
        await out.put(
          chunk(i, ev.text, None, lp, token_ids=[ev.token_id], policy_versions=[ev.version])
        )
      c = await h.result()
      finish = "stop" if c.finish_reason == "abort" else c.finish_reason
      await out.put(chunk(i, "", finish, None, policy_versions=c.policy_versions))

    tasks = [asyncio.create_task(one(i, h)) for i, h in enumerate(handles)]
    waiter = asyncio.gather(*tasks)
    try:
      while not (waiter.done() and out.empty()):
        get = asyncio.create_task(out.get())
        done, _ = await asyncio.wait({get, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
          await resp.write(get.result())
        else:
          get.cancel()
      waiter.result()
      await resp.write(b"data: [DONE]\n\n")
    finally:
      for t in tasks:
        t.cancel()
    await resp.write_eof()
    return resp


def _partial_suffix(text: str, tag: str) -> int:
  """Index where a suffix of `text` that is a proper prefix of `tag` starts (len(text) if none)."""
  for n in range(min(len(tag) - 1, len(text)), 0, -1):
    if text.endswith(tag[:n]):
      return len(text) - n
  return len(text)


# ---------------------------------------------------------------------------- building
def build_server(
  model: Any,
  tokenizer: Any,
  *,
  model_name: str,
  max_concurrent_decodes: int = 8,
  max_seq_len: int = 2048,
  max_queue: int = 256,
  prefill_buckets: Sequence[int] | None = None,
  default_max_tokens: int = 1024,
  mesh: Any = None,
  version: int = 0,
) -> Server:
  """An engine + orchestrator + server for an NNX model and its tokenizer."""
  engine = Engine(
    model,
    max_concurrent_decodes=max_concurrent_decodes,
    max_seq_len=max_seq_len,
    prefill_buckets=prefill_buckets,
    mesh=mesh,
    version=version,
    pad_id=getattr(tokenizer, "pad_id", 0) or 0,
  )
  from ale.chat.template import stop_token_ids  # noqa: PLC0415

  stops = stop_token_ids(tokenizer)
  orch = Orchestrator(
    engine,
    decode=lambda ids: tokenizer.decode(ids, skip_special=False),
    stop_token_ids=stops,
    max_queue=max_queue,
    vocab_size=model.config.vocab_size,
  )
  return Server(orch, tokenizer, model_name, default_max_tokens=default_max_tokens)


def load_model(checkpoint: str | None, preset: str | None, seed: int = 0, dtype: str = "float32"):
  """(model, tokenizer, name) from a checkpoint directory or a preset with random weights."""
  import jax.numpy as jnp  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415

  from ale.chat.tokenizer import ByteTokenizer, load_tokenizer  # noqa: PLC0415

  jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
  if checkpoint:
    from ale.models import from_pretrained  # noqa: PLC0415

    if not os.path.isdir(checkpoint):
      raise SystemExit(f"--checkpoint {checkpoint} is not a directory")
    model = from_pretrained(checkpoint, dtype=jdtype)
    has_tok = os.path.exists(os.path.join(checkpoint, "tokenizer.json"))
    tok = load_tokenizer(checkpoint) if has_tok else ByteTokenizer()
    return model, tok, os.path.basename(os.path.normpath(checkpoint))
  from ale.models import Qwen3MoeForCausalLM, get_preset  # noqa: PLC0415

  model = Qwen3MoeForCausalLM(
    get_preset(preset), rngs=nnx.Rngs(seed), dtype=jdtype, param_dtype=jdtype
  )
  return model, ByteTokenizer(), preset


def main(argv: Sequence[str] | None = None) -> None:
  """`ale-serve --checkpoint DIR | --preset NAME [--port N] [--host H]`."""
  ap = argparse.ArgumentParser(
    prog="ale-serve", description="OpenAI-compatible server for an ale policy."
  )
  src = ap.add_mutually_exclusive_group(required=True)
  src.add_argument(
    "--checkpoint", help="Hugging Face-style checkpoint directory (config.json + safetensors)"
  )
  src.add_argument("--preset", help="model preset with random weights (tiny, small, qwen3-30b-a3b)")
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--port", type=int, default=8000)
  ap.add_argument("--model-name", default=None, help="the model id clients ask for")
  ap.add_argument("--max-concurrent-decodes", type=int, default=8)
  ap.add_argument("--max-seq-len", type=int, default=2048)
  ap.add_argument("--max-queue", type=int, default=256)
  ap.add_argument("--default-max-tokens", type=int, default=1024)
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  ap.add_argument("--seed", type=int, default=0, help="initialisation seed for --preset")
  args = ap.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  model, tok, name = load_model(args.checkpoint, args.preset, args.seed, args.dtype)
  server = build_server(
    model,
    tok,
    model_name=args.model_name or name,
    max_concurrent_decodes=args.max_concurrent_decodes,
    max_seq_len=args.max_seq_len,
    max_queue=args.max_queue,
    default_max_tokens=args.default_max_tokens,
  )
  log.info("serving %s on http://%s:%d/v1", server.model_name, args.host, args.port)
  web.run_app(server.app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
  main()
