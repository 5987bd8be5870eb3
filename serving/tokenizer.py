"""Tokenizers behind one small protocol, and streaming (incremental) detokenization.

Two implementations:

- `ByteTokenizer`: UTF-8 bytes are ids 0..255, BOS is 256 and EOS is 257 (`serving.config.BYTE_*`).
  It needs no files, so it serves every preset: presets with a larger vocabulary (the Llama 3 shapes)
  still accept ids 0..257 as input, and ids the model emits past 257 carry no text (they decode to "").
- `HFTokenizer`: a Hugging Face `tokenizer.json` (the `tokenizers` library), with BOS/EOS read from the
  folder's `generation_config.json`, `config.json` and `tokenizer_config.json`.

`load_tokenizer` picks the Hugging Face one when the model source is a folder with `tokenizer.json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from serving.config import BYTE_BOS, BYTE_EOS, BYTE_VOCAB, ConfigError, ModelConfig

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "Tokenizer",
    "load_tokenizer",
]

_REPLACEMENT = "\ufffd"


@runtime_checkable
class Tokenizer(Protocol):
    """What the serving stack needs from a tokenizer."""

    name: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, preceded by BOS when `add_bos` (and the tokenizer has one)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens skipped; undecodable bytes become U+FFFD."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes, 256 is BOS, 257 is EOS."""

    def __init__(self) -> None:
        self.name = "byte"
        self.vocab_size = BYTE_VOCAB
        self.bos_token_id: int | None = BYTE_BOS
        self.eos_token_ids: tuple[int, ...] = (BYTE_EOS,)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """The UTF-8 bytes of `text` as ids, preceded by BOS (256) when `add_bos`."""
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids in `ids`; BOS and EOS are skipped.

        Ids past the byte range (a larger preset's vocabulary with random weights) render as
        ``<|id|>``, so every generated token stays visible.
        """
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
            elif i >= BYTE_VOCAB:
                parts.append(run.decode("utf-8", errors="replace") + f"<|{i}|>")
                run.clear()
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face `tokenizer.json` with the BOS/EOS ids its checkpoint folder declares."""

    def __init__(
        self,
        folder: str | Path,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        """Load `folder/tokenizer.json`.

        `bos_token_id` is used when the folder's JSON files name no BOS; `eos_token_ids` are added to
        the EOS ids they name.
        """
        from tokenizers import Tokenizer as _HFTok

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{folder}: no tokenizer.json")
        self._tok = _HFTok.from_file(str(path))
        self.name = folder.name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        bos, eos = _special_ids(folder, self._tok)
        self.bos_token_id = bos if bos is not None else bos_token_id
        self.eos_token_ids = tuple(dict.fromkeys([*eos, *eos_token_ids]))

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text` (no template specials), preceded by BOS when `add_bos` and known."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` with special tokens skipped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _token_id(tok: Any, value: Any) -> int | None:
    """Id of a tokenizer_config.json special token entry ("<s>" or {"content": "<s>", ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return tok.token_to_id(value) if isinstance(value, str) else None


def _special_ids(folder: Path, tok: Any) -> tuple[int | None, list[int]]:
    """BOS id and EOS ids from generation_config.json, config.json, then tokenizer_config.json."""
    gen = _read_json(folder / "generation_config.json")
    cfg = _read_json(folder / "config.json")
    tcfg = _read_json(folder / "tokenizer_config.json")
    bos_candidates = [
        *_as_ids(gen.get("bos_token_id")),
        *_as_ids(cfg.get("bos_token_id")),
        _token_id(tok, tcfg.get("bos_token")),
    ]
    bos = next((b for b in bos_candidates if b is not None), None)
    eos = [*_as_ids(gen.get("eos_token_id")), *_as_ids(cfg.get("eos_token_id"))]
    tok_eos = _token_id(tok, tcfg.get("eos_token"))
    if tok_eos is not None:
        eos.append(tok_eos)
    return bos, list(dict.fromkeys(eos))


class IncrementalDetokenizer:
    """Turn a stream of token ids into text deltas, one id at a time.

    Each `add` decodes a short window of recent ids and returns only the text the new id completes.
    While the window's text ends in U+FFFD (a multi-byte character split across tokens, or a byte
    token awaiting its continuation) nothing is emitted; the held text comes out once the character
    completes, or from `flush()` at the end. The concatenated deltas equal `tokenizer.decode` of all
    added ids. `prompt_ids` give left context only (so, e.g., a leading space decodes right); their
    text is never emitted.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), context: int = 5) -> None:
        self.tokenizer = tokenizer
        self._ids: list[int] = list(prompt_ids)
        self._read = len(self._ids)  # ids before this are emitted (or are prompt context)
        self._prefix = max(self._read - context, 0)  # start of the decoding window
        self._first_output = self._read

    @property
    def token_ids(self) -> list[int]:
        """Ids added so far (without the prompt)."""
        return self._ids[self._first_output :]

    def add(self, token_id: int) -> str:
        """Append one id; return the newly completed text ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self.tokenizer.decode(self._ids[self._prefix : self._read])
        text = self.tokenizer.decode(self._ids[self._prefix :])
        if len(text) > len(prefix_text) and not text.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(prefix_text) :]
        return ""

    __call__ = add

    def flush(self) -> str:
        """Return whatever text is still held (an unfinished character decodes to U+FFFD)."""
        prefix_text = self.tokenizer.decode(self._ids[self._prefix : self._read])
        text = self.tokenizer.decode(self._ids[self._prefix :])
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]


def load_tokenizer(source: str | Path, cfg: ModelConfig) -> Tokenizer:
    """Tokenizer for the model loaded from `source` (a preset name or a checkpoint folder).

    A folder with `tokenizer.json` gives an `HFTokenizer` (the config's BOS/EOS ids are fallbacks);
    anything else gives the `ByteTokenizer`, whose ids 0..257 are valid in every preset's vocabulary.
    """
    path = Path(source)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        tok: Tokenizer = HFTokenizer(path, bos_token_id=cfg.bos_token_id, eos_token_ids=cfg.eos_token_ids)
        if tok.vocab_size > cfg.vocab_size:
            raise ConfigError(
                f"{path}: tokenizer has {tok.vocab_size} tokens but the model's vocab_size is {cfg.vocab_size}"
            )
        return tok
    if cfg.vocab_size < BYTE_VOCAB:
        raise ConfigError(
            f"model {cfg.name!r} has vocab_size {cfg.vocab_size} < {BYTE_VOCAB} and no tokenizer.json; "
            "the byte tokenizer needs ids 0..257"
        )
    return ByteTokenizer()
