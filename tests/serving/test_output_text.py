"""OutputText: incremental text with stop strings matched across tokens and held back while undecided."""

from __future__ import annotations

import pytest

from serving.config import BYTE_BOS
from serving.output_text import OutputText
from serving.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def _feed(text: str, stop: list[str]) -> tuple[list[str], OutputText]:
    """Add `text` byte by byte as the pool does; release after each token as a stream does."""
    out = OutputText(TOK, [BYTE_BOS], stop)
    deltas = []
    for i, b in enumerate(text.encode()):
        stopped = out.add(b)
        if stopped or i == len(text.encode()) - 1:
            out.finish()
        deltas.append(out.release(i + 1))
        if stopped:
            break
    return deltas, out


def test_no_stop_releases_every_token() -> None:
    deltas, out = _feed("hello", [])
    assert deltas == ["h", "e", "l", "l", "o"] and out.text == "hello" and out.num_tokens == 5


def test_stop_string_spanning_tokens_cuts_before_it() -> None:
    deltas, out = _feed("hello world, more", ["lo w"])
    assert "".join(deltas) == "hel" and out.text == "hel"
    assert out.stopped and out.num_tokens == len("hello w")  # the token that completed the match


def test_text_that_may_start_a_stop_string_is_held_then_released() -> None:
    deltas, out = _feed("abcabd", ["abd!"])
    assert deltas == ["", "", "abc", "", "", "abd"]  # "ab", then "abd": held; the end releases it
    assert out.text == "abcabd" and out.num_tokens == 6


def test_earliest_of_several_stop_strings_wins() -> None:
    _, out = _feed("one two three", ["three", "two", "e t"])
    assert out.text == "on" and out.num_tokens == 5  # "e t" completes first
    _, out = _feed("one two three", ["wo", "two"])
    assert out.text == "one " and out.num_tokens == 7  # both complete on "o": the earlier start wins


def test_stop_at_the_very_start_gives_empty_text() -> None:
    deltas, out = _feed("stop here", ["st"])
    assert "".join(deltas) == "" and out.text == "" and out.num_tokens == 2


def test_multibyte_characters_and_stop() -> None:
    deltas, out = _feed("añb€c", ["€"])
    assert "".join(deltas) == "añb" and out.num_tokens == len("añb€".encode())


def test_release_by_token_count_lags_behind_added_tokens() -> None:
    """The pool adds tokens before the stream takes their events: release(k) gives token k's text only."""
    out = OutputText(TOK, [BYTE_BOS], ["zz"])
    for b in b"abcz":
        out.add(b)
    assert out.release(1) == "a"
    assert out.release(3) == "bc"
    assert out.release(4) == ""  # "z" may start "zz"
    out.finish()
    assert out.release(4) == "z"


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(["x" * 10_000], "the quick brown fox " * 20), (["d", "c", "b", "a"], "the qui")],
)
def test_long_and_many_stop_strings(stop: list[str], expected: str) -> None:
    _, out = _feed("the quick brown fox " * 20, stop)
    assert out.text == expected
