"""OpenAI-compatible request parsing and response shapes (completions and chat completions)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from serving.config import ConfigError, SamplingParams


class BadRequest(ValueError):
    """An invalid API request: becomes HTTP 400 with an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": 400}
        }


MAX_STOP_STRINGS = 4  # as OpenAI

# Parameters of OpenAI's (and vLLM's) request bodies that this server does not implement. Each may be
# sent with its default (a no-op, so ordinary clients work); any other value is a 400 naming it.
# Unknown keys outside this table are ignored, as vLLM does.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "store": (None, False),
    # vLLM sampling extensions
    "top_k": (None, -1, 0),
    "min_p": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "prompt_logprobs": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "truncate_prompt_tokens": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
}


@dataclass(slots=True)
class ParsedRequest:
    prompt: str | None
    prompt_ids: list[int] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    chat: bool
    return_token_ids: bool = False  # vLLM extension: token ids beside the text
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one


class _NonFinite:
    """Stands in for a JSON NaN/Infinity while parsing, so the walk can name where it was."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "body"


def loads_body(raw: bytes) -> Any:
    """Parse a request body as strict JSON: no NaN/Infinity, no lone surrogates; 400s name the field."""
    try:
        body = json.loads(raw, parse_constant=_NonFinite)
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    stack: list[tuple[Any, list[str | int]]] = [(body, [])]
    while stack:
        value, where = stack.pop()
        if isinstance(value, _NonFinite):
            raise BadRequest(
                f"'{_path(where)}' is {value.literal}; numbers must be finite (NaN and Infinity are not JSON)",
                _path(where),
            )
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(
                    f"'{_path(where)}' contains a lone UTF-16 surrogate; strings must be valid Unicode",
                    _path(where),
                ) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, where))  # keys are strings too
                stack.append((v, [*where, k]))
        elif isinstance(value, list):
            stack.extend((v, [*where, i]) for i, v in enumerate(value))
    return body


def _show(value: Any, limit: int = 80) -> str:
    """repr of a client's value, shortened for an error message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _number(body: dict[str, Any], key: str, default: float, kind: type) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
    ):
        raise BadRequest(
            f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {_show(value)}", key
        )
    try:
        number = kind(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if isinstance(number, float) and not math.isfinite(number):
        raise BadRequest(f"'{key}' must be a finite number, got {_show(value)}", key)
    return number


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return value == default


def _check_unsupported(body: dict[str, Any]) -> None:
    for key, defaults in UNSUPPORTED_DEFAULTS.items():
        if key in body and not any(_is_default(body[key], d) for d in defaults):
            accepted = ", ".join(json.dumps(d) for d in defaults)
            raise BadRequest(
                f"parameter '{key}' is not supported by this server (accepted only as a no-op: "
                f"{accepted}), got {_show(body[key])}",
                key,
            )


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise BadRequest(
            f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} non-empty strings, "
            f"got {_show(stop)}",
            "stop",
        )
    return tuple(dict.fromkeys(stop))


def _stop_token_ids(body: dict[str, Any]) -> tuple[int, ...]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        raise BadRequest(
            f"'stop_token_ids' must be a list of token ids (integers >= 0), got {_show(ids)}",
            "stop_token_ids",
        )
    return tuple(ids)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false, got {_show(value)}", key)
    return value


def render_chat(messages: Any) -> str:
    """Flatten chat messages into one prompt (a plain role-tagged template)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRequest(
                f"messages[{i}] must have 'role' one of system, user, assistant, tool", f"messages[{i}]"
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones are kept, others must be well-formed
            texts = []
            for j, p in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if not isinstance(p, dict) or not isinstance(p.get("type"), str):
                    raise BadRequest(f"{where} must be an object with a string 'type'", where)
                if p["type"] == "text":
                    if not isinstance(p.get("text"), str):
                        raise BadRequest(
                            f"{where}.text must be a string, got {_show(p.get('text'))}", f"{where}.text"
                        )
                    texts.append(p["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", f"messages[{i}].content")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def parse_request(body: Any, *, chat: bool, served_model: str) -> ParsedRequest:
    """Validate a /v1/completions or /v1/chat/completions body."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model:
        raise BadRequest(f"model {_show(model)} does not exist; this server serves {served_model!r}", "model")
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n != 1:
        raise BadRequest(f"'n' must be 1, got {_show(n)}", "n")
    _check_unsupported(body)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest(f"'user' must be a string, got {_show(user)}", "user")
    prompt, prompt_ids = None, None
    if chat:
        prompt = render_chat(body.get("messages"))
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if isinstance(raw, str):
            prompt = raw
        elif (
            isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw)
        ):
            prompt_ids = list(raw)
        else:
            raise BadRequest("'prompt' must be a string or a non-empty list of token ids", "prompt")
    max_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number(body, max_key, 16, int)
    if max_tokens <= 0:
        raise BadRequest(f"'{max_key}' must be at least 1, got {max_tokens}", max_key)
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**64
    ):
        raise BadRequest(f"'seed' must be an integer in [-2**63, 2**64), got {_show(seed)}", "seed")
    stream_options = body.get("stream_options")
    if stream_options is None:
        stream_options = {}
    if not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    include_usage = stream_options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise BadRequest(
            f"'stream_options.include_usage' must be true or false, got {_show(include_usage)}",
            "stream_options.include_usage",
        )
    temperature = _number(body, "temperature", 1.0, float)
    if temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {temperature}", "temperature")
    penalties = {key: _number(body, key, 0.0, float) for key in ("presence_penalty", "frequency_penalty")}
    for key, value in penalties.items():
        if not -2 <= value <= 2:
            raise BadRequest(f"{key} must be in [-2, 2], got {value}", key)
    top_p = _number(body, "top_p", 1.0, float)
    if not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}", "top_p")
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            ignore_eos=_flag(body, "ignore_eos"),
            stop_token_ids=_stop_token_ids(body),
            **penalties,
        )
    except ConfigError as e:
        raise BadRequest(str(e)) from e
    return ParsedRequest(
        prompt,
        prompt_ids,
        params,
        _flag(body, "stream"),
        bool(include_usage),
        chat,
        _flag(body, "return_token_ids"),
        _stop_strings(body),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(
    request_id: str,
    model: str,
    text: str,
    finish_reason: str | None,
    *,
    chat: bool,
    first: bool,
    token_ids: list[int] | None = None,
) -> dict:
    """One streaming chunk in the completion or chat-completion shape."""
    created = int(time.time())
    if chat:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        obj = "text_completion"
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(
    request_id: str, model: str, prompt_tokens: int, completion_tokens: int, *, chat: bool
) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def full_response(
    request_id: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    chat: bool,
    token_ids: tuple[list[int], list[int]] | None = None,
) -> dict:
    """A non-streaming response body; `token_ids` = (prompt ids, output ids) when asked for."""
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        obj = "text_completion"
    if token_ids is not None:
        choice["prompt_token_ids"], choice["token_ids"] = token_ids
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
