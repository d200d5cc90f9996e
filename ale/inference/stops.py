"""Incremental detokenisation with stop strings, for streaming completions.

`CompletionText` receives sampled token ids one at a time and yields the text that is
safe to show: text that can no longer change (no dangling partial UTF-8 character) and
that cannot be the start of a stop string. When a stop string appears, the text is cut
right before it and the completion is over (OpenAI semantics: the stop string is not
returned). Token ids are never cut: the engine keeps every sampled token with its
log-prob, because those are what the policy produced.
"""

from __future__ import annotations

from typing import Callable, Sequence

_REPLACEMENT = "\ufffd"  # what a byte-level decoder writes for an incomplete UTF-8 sequence


class CompletionText:
  """Detokenises a growing completion and watches for stop strings.

  Args:
    decode: maps token ids to text (special tokens kept, so tool-call tags survive).
    stop: stop strings; empty strings are ignored.
  """

  def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
    self._decode = decode
    self._stop = tuple(s for s in stop if s)
    self._max_stop = max((len(s) for s in self._stop), default=0)
    self._ids: list[int] = []
    self._stable = ""  # decoded text of self._ids[:self._offset], final
    self._offset = 0
    self._text = ""  # full decoded text so far (cut at a stop string once stopped)
    self._emitted = 0  # characters of self._text already handed out
    self.stopped = False
    self.stop_string: str | None = None

  @property
  def text(self) -> str:
    return self._text

  def push(self, token_id: int) -> str:
    """Adds one token; returns the newly safe text (possibly empty)."""
    if self.stopped:
      return ""
    self._ids.append(int(token_id))
    tail = self._decode(self._ids[self._offset :])
    if not tail.endswith(_REPLACEMENT):
      self._stable += tail
      self._offset = len(self._ids)
      self._text = self._stable
    else:
      self._text = self._stable + tail
    search_from = max(0, self._emitted - self._max_stop)
    hits = [(i, s) for s in self._stop if (i := self._text.find(s, search_from)) >= 0]
    if hits:
      cut, self.stop_string = min(hits)
      self._text = self._text[:cut]
      self.stopped = True
      return self._flush()
    end = len(self._text.rstrip(_REPLACEMENT))
    hold = 0
    for s in self._stop:  # hold back a suffix that may grow into a stop string
      for n in range(min(len(s) - 1, end), hold, -1):
        if self._text.endswith(s[:n], 0, end):
          hold = n
          break
    return self._take(max(end - hold, self._emitted))

  def finish(self) -> str:
    """The completion ended for another reason: hand out whatever is held back."""
    return self._flush()

  def _flush(self) -> str:
    return self._take(len(self._text))

  def _take(self, end: int) -> str:
    out = self._text[self._emitted : end]
    self._emitted = max(self._emitted, end)
    return out
