"""Byte and Hugging Face tokenizers, and incremental detokenization of split multi-byte characters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.config import BYTE_BOS, BYTE_EOS, ConfigError, ModelConfig, preset
from serving.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    IncrementalDetokenizer,
    Tokenizer,
    load_tokenizer,
)

TEXT = "héllo 世界 🚀"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello tokenizer",
    "héllo 世界 🚀 and some more words to merge",
    "serving prefill and decode on separate pools",
]


def _stream(tok: Tokenizer, ids: list[int], prompt: list[int] | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt or [])
    deltas = [detok.add(i) for i in ids]
    return [*deltas, detok.flush()]


# --- byte tokenizer ------------------------------------------------------------------------------


def test_byte_round_trip_multibyte() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert ids[0] == BYTE_BOS and ids[1:] == list(TEXT.encode())
    assert tok.encode(TEXT, add_bos=False) == ids[1:]
    assert tok.decode(ids) == TEXT
    assert tok.decode([*ids, BYTE_EOS]) == TEXT  # specials skipped
    assert tok.decode([*ids, 1000, 104]) == TEXT + "<|1000|>h"  # ids past the byte range stay visible
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"  # broken UTF-8 is replaced, never raised
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_ids) == (258, 256, (257,))
    assert isinstance(tok, Tokenizer)


def test_incremental_never_splits_characters() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT, add_bos=False)
    deltas = _stream(tok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == TEXT
    # the four bytes of the rocket come out at once, on the last one
    assert deltas[-5:] == ["", "", "", "🚀", ""]


def test_incremental_with_prompt_context_and_specials() -> None:
    tok = ByteTokenizer()
    prompt = tok.encode("prompt 世界")
    out = [*tok.encode("→ ok", add_bos=False), BYTE_EOS]
    deltas = _stream(tok, out, prompt)
    assert "".join(deltas) == "→ ok"
    assert all("\ufffd" not in d for d in deltas)


def test_flush_returns_unfinished_character() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ord("a")) == "a"
    assert detok.add(0xF0) == "" and detok.add(0x9F) == ""
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""
    assert detok.token_ids == [ord("a"), 0xF0, 0x9F]


def test_invalid_bytes_are_not_held_forever() -> None:
    tok = ByteTokenizer()
    ids = [0xFF, *b"ab"]
    assert "".join(_stream(tok, ids)) == tok.decode(ids) == "\ufffdab"


# --- Hugging Face tokenizer ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained in memory on a few sentences, saved with Llama-style JSON files."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<eot>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(CORPUS, trainer=trainer)
    folder = tmp_path_factory.mktemp("hf-tok")
    raw.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": "<eot>"}})
    )
    return folder


def test_hf_tokenizer_round_trip(hf_folder: Path) -> None:
    tok = HFTokenizer(hf_folder)
    assert isinstance(tok, Tokenizer)
    assert tok.bos_token_id == 0 and tok.eos_token_ids == (1, 2)
    assert tok.name == hf_folder.name and 256 < tok.vocab_size <= 400
    for text in [*CORPUS, TEXT, "unseen wörds ✓"]:
        ids = tok.encode(text)
        assert ids[0] == 0 and 0 not in ids[1:]
        assert tok.decode(ids) == text
        assert tok.encode(text, add_bos=False) == ids[1:]
    assert len(tok.encode(CORPUS[0], add_bos=False)) < len(CORPUS[0])  # merges were learnt


def test_hf_incremental_matches_decode(hf_folder: Path) -> None:
    tok = HFTokenizer(hf_folder)
    ids = [*tok.encode(f"{TEXT} {CORPUS[1]} ✓🚀", add_bos=False), 1]
    deltas = _stream(tok, ids, prompt=tok.encode("context"))
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas[:-1]  # some character was split across tokens and held back
    assert "".join(deltas) == tok.decode(ids)


def test_hf_special_ids_fall_back_to_config(tmp_path: Path, hf_folder: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    tok = HFTokenizer(tmp_path, bos_token_id=0, eos_token_ids=(2,))
    assert tok.bos_token_id == 0 and tok.eos_token_ids == (2,)
    assert HFTokenizer(tmp_path).encode("hi") == HFTokenizer(tmp_path).encode("hi", add_bos=False)


def test_hf_tokenizer_needs_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        HFTokenizer(tmp_path)


# --- load_tokenizer ------------------------------------------------------------------------------


def _cfg(vocab: int) -> ModelConfig:
    return ModelConfig(
        name="t",
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        max_position=64,
    )


def test_load_tokenizer_picks_by_source(hf_folder: Path, tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(hf_folder, _cfg(400)), HFTokenizer)
    for name in ("tiny", "llama-3.2-1b"):
        assert isinstance(load_tokenizer(name, preset(name)), ByteTokenizer)
    assert isinstance(load_tokenizer(tmp_path, _cfg(300)), ByteTokenizer)  # folder without tokenizer.json


def test_load_tokenizer_rejects_mismatched_vocab(hf_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer has .* tokens but the model's vocab_size is 260"):
        load_tokenizer(hf_folder, _cfg(260))
    with pytest.raises(ConfigError, match=r"byte tokenizer needs ids 0\.\.257"):
        load_tokenizer(tmp_path, _cfg(100))
