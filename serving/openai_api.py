"""OpenAI-compatible request parsing and response shapes (completions and chat completions)."""

from __future__ import annotations

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


@dataclass(slots=True)
class ParsedRequest:
    prompt: str | None
    prompt_ids: list[int] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    chat: bool
    return_token_ids: bool = False  # vLLM extension: token ids beside the text


def _number(body: dict[str, Any], key: str, default: float, kind: type) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
    ):
        raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", key)
    return kind(value)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false, got {value!r}", key)
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
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
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
        raise BadRequest(f"model {model!r} does not exist; this server serves {served_model!r}", "model")
    n = body.get("n", 1)
    if isinstance(n, bool) or n != 1:
        raise BadRequest(f"'n' must be 1, got {n!r}", "n")
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
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be an integer, got {seed!r}", "seed")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    temperature = _number(body, "temperature", 1.0, float)
    if temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {temperature}", "temperature")
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
        )
    except ConfigError as e:
        raise BadRequest(str(e)) from e
    return ParsedRequest(
        prompt,
        prompt_ids,
        params,
        _flag(body, "stream"),
        bool(stream_options.get("include_usage")),
        chat,
        _flag(body, "return_token_ids"),
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
