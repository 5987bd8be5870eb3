"""A request's output text as its tokens arrive: detokenized, cut before the first stop string.

Stop strings are matched on the decoded text, so one may span several tokens. Text that could be the
start of a stop string is held back until the following tokens show whether it is one; nothing after
a stop string's start is ever released (OpenAI's behaviour: the stop string itself is not returned).
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputText:
    """Feed token ids with `add`; read releasable text with `release`; end with `finish`."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stop = tuple(s for s in stop if s)
        self._text = ""
        self._searched = 0  # text before this index contains no stop string start that is complete
        self._released = 0
        self._safe_after: list[int] = []  # releasable text length after each token
        self.num_tokens = 0
        self.stopped = False  # a stop string matched: the text is final

    @property
    def text(self) -> str:
        """All text decided so far (without held-back text)."""
        return self._text[: self._safe_len()]

    def add(self, token_id: int) -> bool:
        """Append one token; True when the text now holds a stop string (the request must end)."""
        if self.stopped:
            return True
        self.num_tokens += 1
        self._append(self._detok.add(token_id))
        self._safe_after.append(self._safe_len())
        return self.stopped

    def finish(self) -> None:
        """No more tokens: decode what the detokenizer still holds and release everything."""
        if not self.stopped:
            self._append(self._detok.flush())
        self.stopped = True

    def release(self, num_tokens: int | None = None) -> str:
        """Text not yet released that is decided once `num_tokens` tokens are in (default: all added)."""
        n = self.num_tokens if num_tokens is None else num_tokens
        end = (
            len(self._text) if self.stopped and n >= self.num_tokens else self._safe_after[n - 1] if n else 0
        )
        out = self._text[self._released : max(end, self._released)]
        self._released = max(end, self._released)
        return out

    def _append(self, delta: str) -> None:
        if not delta:
            return
        self._text += delta
        if not self._stop:
            return
        longest = max(len(s) for s in self._stop)
        start = max(0, self._searched - longest + 1)
        hits = [i for i in (self._text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self._text = self._text[: min(hits)]
            self.stopped = True
        self._searched = len(self._text)

    def _safe_len(self) -> int:
        """Length of the text that cannot be the start of a stop string."""
        if self.stopped or not self._stop:
            return len(self._text)
        text = self._text
        if not text:
            return 0
        hold, last = 0, text[-1]
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if s[n - 1] == last and text.endswith(s[:n]):
                    hold = n
                    break
        return len(text) - hold
