"""OpenAI-compatible request parsing and response shapes."""

from __future__ import annotations

import time

import pytest

from serving.config import SamplingParams
from serving.openai_api import (
    BadRequest,
    chunk,
    full_response,
    loads_body,
    parse_request,
    render_chat,
    usage,
    usage_chunk,
)

MODEL = "tiny"


def _parse(body, chat: bool = False):
    return parse_request(body, chat=chat, served_model=MODEL)


def _bad(body, chat: bool = False) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        _parse(body, chat)
    return e.value


# -- accepted requests -------------------------------------------------------------------------------


def test_string_prompt_and_defaults() -> None:
    r = _parse({"model": MODEL, "prompt": "hello"})
    assert r.prompt == "hello" and r.prompt_ids is None
    assert r.params == SamplingParams(max_tokens=16, temperature=1.0, top_p=1.0)
    assert r.stream is False and r.include_usage is False and r.chat is False


def test_model_may_be_omitted() -> None:
    assert _parse({"prompt": "x"}).prompt == "x"


def test_list_of_one_string_prompt() -> None:
    r = _parse({"prompt": ["hello"]})
    assert r.prompt == "hello" and r.prompt_ids is None


def test_token_id_prompt() -> None:
    r = _parse({"prompt": [1, 2, 3]})
    assert r.prompt is None and r.prompt_ids == [1, 2, 3]


def test_sampling_fields_and_stream_options() -> None:
    r = _parse(
        {
            "prompt": "x",
            "max_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
        }
    )
    assert r.params == SamplingParams(max_tokens=7, temperature=0.0, top_p=0.5, seed=3, ignore_eos=True)
    assert isinstance(r.params.temperature, float)
    assert r.stream is True and r.include_usage is True


def test_null_numbers_take_defaults() -> None:
    r = _parse({"prompt": "x", "max_tokens": None, "temperature": None, "top_p": None})
    assert r.params.max_tokens == 16 and r.params.temperature == 1.0 and r.params.top_p == 1.0


def test_chat_request_renders_messages() -> None:
    r = _parse(
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_completion_tokens": 5,
            "max_tokens": 99,
        },
        chat=True,
    )
    assert r.chat is True
    assert r.prompt == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert r.prompt_ids is None
    assert r.params.max_tokens == 5  # max_completion_tokens wins for chat


def test_chat_uses_max_tokens_without_max_completion_tokens() -> None:
    r = _parse({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}, chat=True)
    assert r.params.max_tokens == 9


def test_render_chat_content_parts() -> None:
    text = render_chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url"},
                    {"type": "text", "text": "b"},
                ],
            },
            {"role": "assistant", "content": "c"},
        ]
    )
    assert text == "<|user|>\nab\n<|assistant|>\nc\n<|assistant|>\n"


# -- rejected requests ------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [None, [], "prompt", 3])
def test_non_object_body(body) -> None:
    assert "JSON object" in str(_bad(body))


def test_wrong_model() -> None:
    e = _bad({"model": "gpt-4", "prompt": "x"})
    assert e.param == "model"
    assert "'gpt-4'" in str(e) and "'tiny'" in str(e)


@pytest.mark.parametrize("n", [0, 2, "1", 1.5])
def test_n_must_be_one(n) -> None:
    e = _bad({"prompt": "x", "n": n})
    assert e.param == "n"
    assert "'n' must be 1" in str(e)


def test_n_rejects_bool() -> None:
    _bad({"prompt": "x", "n": True})


@pytest.mark.parametrize("prompt", [None, [], ["a", "b"], [1, "a"], [1, True], [1.0], {"text": "x"}, 5])
def test_bad_prompt(prompt) -> None:
    e = _bad({"prompt": prompt})
    assert e.param == "prompt"
    assert "string" in str(e) and "token ids" in str(e)


@pytest.mark.parametrize("value", [0, -3])
def test_max_tokens_must_be_positive(value) -> None:
    e = _bad({"prompt": "x", "max_tokens": value})
    assert e.param == "max_tokens"
    assert "'max_tokens' must be at least 1" in str(e)


@pytest.mark.parametrize("value", [1.5, 2.0, "4", True, [4]])
def test_max_tokens_must_be_integer(value) -> None:
    e = _bad({"prompt": "x", "max_tokens": value})
    assert e.param == "max_tokens"
    assert "'max_tokens' must be an integer" in str(e)


def test_max_completion_tokens_named_in_chat_error() -> None:
    e = _bad({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, chat=True)
    assert e.param == "max_completion_tokens"
    assert "'max_completion_tokens'" in str(e)


@pytest.mark.parametrize("key", ["temperature", "top_p"])
@pytest.mark.parametrize("value", [True, False, "0.5", [0.5]])
def test_number_fields_reject_non_numbers_and_bools(key, value) -> None:
    e = _bad({"prompt": "x", key: value})
    assert e.param == key
    assert f"'{key}' must be a number" in str(e)


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("temperature", -0.1, ">= 0"),
        ("top_p", 0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_p", -1, "(0, 1]"),
    ],
)
def test_out_of_range_sampling_values(key, value, allowed) -> None:
    e = _bad({"prompt": "x", key: value})
    assert key in str(e)
    assert allowed in str(e)


def test_out_of_range_sampling_value_names_param() -> None:
    assert _bad({"prompt": "x", "temperature": -1}).param == "temperature"


@pytest.mark.parametrize("seed", [1.5, "3", True])
def test_bad_seed(seed) -> None:
    assert _bad({"prompt": "x", "seed": seed}).param == "seed"


@pytest.mark.parametrize("key", ["stream", "ignore_eos"])
def test_flags_must_be_bool(key) -> None:
    e = _bad({"prompt": "x", key: 1})
    assert e.param == key
    assert "true or false" in str(e)


def test_stream_options_must_be_object() -> None:
    assert _bad({"prompt": "x", "stream_options": [1]}).param == "stream_options"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (None, "messages"),
        ([], "messages"),
        ("hi", "messages"),
        ([{"role": "robot", "content": "x"}], "messages[0]"),
        (["hi"], "messages[0]"),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": 3}], "messages[1].content"),
        ([{"role": "user"}], "messages[0].content"),
    ],
)
def test_bad_chat_messages(messages, param) -> None:
    e = _bad({"messages": messages}, chat=True)
    assert e.param == param
    assert param.split(".")[0] in str(e)


def test_bad_role_message_lists_allowed_roles() -> None:
    e = _bad({"messages": [{"role": "robot", "content": "x"}]}, chat=True)
    for role in ("system", "user", "assistant", "tool"):
        assert role in str(e)


def test_error_body_shape() -> None:
    e = _bad({"model": "other", "prompt": "x"})
    assert e.body() == {
        "error": {"message": str(e), "type": "invalid_request_error", "param": "model", "code": 400}
    }


# -- response shapes -----------------------------------------------------------------------------------


def test_usage() -> None:
    assert usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_completion_chunk_shape() -> None:
    before = int(time.time())
    c = chunk("cmpl-1", MODEL, "he", None, chat=False, first=True)
    assert set(c) == {"id", "object", "created", "model", "choices"}
    assert c["id"] == "cmpl-1" and c["object"] == "text_completion" and c["model"] == MODEL
    assert before <= c["created"] <= int(time.time())
    assert c["choices"] == [{"index": 0, "text": "he", "finish_reason": None, "logprobs": None}]


def test_chat_chunk_shape() -> None:
    first = chunk("chatcmpl-1", MODEL, "he", None, chat=True, first=True)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {"index": 0, "delta": {"content": "he", "role": "assistant"}, "finish_reason": None, "logprobs": None}
    ]
    later = chunk("chatcmpl-1", MODEL, "y", "stop", chat=True, first=False)
    assert later["choices"][0]["delta"] == {"content": "y"}
    assert later["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("chat", "obj"), [(False, "text_completion"), (True, "chat.completion.chunk")])
def test_usage_chunk_shape(chat, obj) -> None:
    u = usage_chunk("id-1", MODEL, 5, 2, chat=chat)
    assert u["object"] == obj
    assert u["choices"] == []
    assert u["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert {"id", "created", "model"} <= set(u)


def test_full_completion_shape() -> None:
    r = full_response("cmpl-2", MODEL, "hello", "length", 3, 5, chat=False)
    assert set(r) == {"id", "object", "created", "model", "choices", "usage"}
    assert r["object"] == "text_completion"
    assert r["choices"] == [{"index": 0, "text": "hello", "finish_reason": "length", "logprobs": None}]
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert isinstance(r["created"], int)


def test_full_chat_completion_shape() -> None:
    r = full_response("chatcmpl-2", MODEL, "hi!", "stop", 4, 2, chat=True)
    assert r["object"] == "chat.completion"
    assert r["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi!"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert r["usage"]["total_tokens"] == 6


def test_shapes_validate_against_the_openai_client_types() -> None:
    openai_types = pytest.importorskip("openai.types")
    chat_types = pytest.importorskip("openai.types.chat")
    done = openai_types.Completion.model_validate(full_response("c", MODEL, "t", "stop", 1, 2, chat=False))
    assert done.choices[0].text == "t" and done.usage.total_tokens == 3
    last = openai_types.Completion.model_validate(chunk("c", MODEL, "t", "length", chat=False, first=False))
    assert last.choices[0].finish_reason == "length"
    cc = chat_types.ChatCompletion.model_validate(full_response("c", MODEL, "t", "length", 1, 2, chat=True))
    assert cc.choices[0].message.content == "t" and cc.choices[0].message.role == "assistant"
    for first in (True, False):
        ch = chat_types.ChatCompletionChunk.model_validate(
            chunk("c", MODEL, "t", None, chat=True, first=first)
        )
        assert ch.choices[0].delta.content == "t"
    u = chat_types.ChatCompletionChunk.model_validate(usage_chunk("c", MODEL, 1, 2, chat=True))
    assert u.usage.completion_tokens == 2 and u.choices == []


# -- strict JSON bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (b'{"prompt": "x", "temperature": NaN}', "temperature", "NaN"),
        (b'{"prompt": "x", "top_p": Infinity}', "top_p", "Infinity"),
        (b'{"prompt": "x", "stop": ["a", -Infinity]}', "stop[1]", "-Infinity"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": NaN}]}]}',
            "messages[0].content[0].text",
            "NaN",
        ),
        (b'{"prompt": "\\ud800"}', "prompt", "surrogate"),
        (b'{"prompt": "x", "user": "a\\udfffb"}', "user", "surrogate"),
    ],
)
def test_loads_body_rejects_non_finite_numbers_and_surrogates(raw: bytes, param: str, needle: str) -> None:
    with pytest.raises(BadRequest) as e:
        loads_body(raw)
    assert e.value.param == param
    assert needle in str(e.value) and param in str(e.value)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"max_tokens": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_loads_body_rejects_malformed_bytes(raw: bytes, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        loads_body(raw)


def test_loads_body_accepts_ordinary_json() -> None:
    assert loads_body(b'{"prompt": "h\\u00e9 \\ud83d\\ude00", "temperature": 1e-3}') == {
        "prompt": "hé 😀",
        "temperature": 1e-3,
    }


# -- every sampling parameter validated ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("temperature", float("nan")), ("temperature", float("inf")), ("top_p", float("nan"))],
)
def test_non_finite_numbers_are_rejected(key: str, value: float) -> None:
    e = _bad({"prompt": "x", key: value})
    assert e.param == key and "finite" in str(e)


def test_tiny_temperature_is_accepted() -> None:
    assert _parse({"prompt": "x", "temperature": 1e-44}).params.temperature == 1e-44


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_seed_out_of_range(seed: int) -> None:
    assert _bad({"prompt": "x", "seed": seed}).param == "seed"


def test_stop_strings_and_stop_token_ids() -> None:
    r = _parse({"prompt": "x", "stop": "\n\n", "stop_token_ids": [5, 9]})
    assert r.stop == ("\n\n",) and r.params.stop_token_ids == (5, 9)
    assert _parse({"prompt": "x", "stop": ["a", "bc", "a"]}).stop == ("a", "bc")
    assert _parse({"prompt": "x", "stop": None}).stop == ()


@pytest.mark.parametrize("stop", ["", [""], ["a", "b", "c", "d", "e"], 5, [1], {"a": 1}, ["a", None]])
def test_bad_stop(stop) -> None:
    e = _bad({"prompt": "x", "stop": stop})
    assert e.param == "stop" and "up to 4" in str(e)


@pytest.mark.parametrize("ids", [5, [1.5], [-1], [True], "5"])
def test_bad_stop_token_ids(ids) -> None:
    assert _bad({"prompt": "x", "stop_token_ids": ids}).param == "stop_token_ids"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("logprobs", 1),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("echo", True),
        ("logit_bias", {"5": 10}),
        ("best_of", 2),
        ("suffix", "end"),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("functions", [{"name": "f"}]),
        ("response_format", {"type": "json_object"}),
        ("top_k", 5),
        ("repetition_penalty", 1.2),
        ("include_stop_str_in_output", True),
    ],
)
def test_unsupported_parameters_with_values_are_400(key: str, value) -> None:
    for chat in (False, True):
        body = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"}
        e = _bad({**body, key: value}, chat=chat)
        assert e.param == key
        assert f"parameter '{key}' is not supported by this server" in str(e)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("logprobs", None),
        ("logprobs", False),
        ("top_logprobs", 0),
        ("echo", False),
        ("presence_penalty", 0),
        ("frequency_penalty", 0.0),
        ("logit_bias", {}),
        ("best_of", 1),
        ("tools", []),
        ("tool_choice", "none"),
        ("response_format", {"type": "text"}),
        ("user", "someone"),
        ("an_unknown_key", [1, 2]),
    ],
)
def test_default_values_of_unsupported_parameters_are_accepted(key: str, value) -> None:
    assert _parse({"prompt": "x", key: value}).prompt == "x"


def test_user_must_be_a_string() -> None:
    assert _bad({"prompt": "x", "user": 5}).param == "user"


def test_include_usage_must_be_bool() -> None:
    assert _bad({"prompt": "x", "stream_options": {"include_usage": "yes"}}).param == (
        "stream_options.include_usage"
    )


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "text", "text": 5}, "messages[0].content[0].text"),
        ({"type": "text"}, "messages[0].content[0].text"),
        ("just a string", "messages[0].content[0]"),
        ({"text": "no type"}, "messages[0].content[0]"),
    ],
)
def test_bad_chat_content_parts(part, param: str) -> None:
    e = _bad({"messages": [{"role": "user", "content": [part]}]}, chat=True)
    assert e.param == param


@pytest.mark.parametrize("key", ["temperature", "top_p"])
def test_integer_too_large_for_a_float_is_400(key: str) -> None:
    e = _bad({"prompt": "x", key: 10**400})
    assert e.param == key and "finite" in str(e) and len(str(e)) < 300


def test_penalties_are_parsed() -> None:
    r = _parse({"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -2})
    assert r.params.presence_penalty == 0.5 and r.params.frequency_penalty == -2.0
    assert r.params.penalized and not _parse({"prompt": "x", "presence_penalty": 0}).params.penalized


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -3, "1", True])
def test_bad_penalties(key: str, value) -> None:
    assert _bad({"prompt": "x", key: value}).param == key
