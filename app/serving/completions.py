"""S4: OpenAI's chat and text completions, translated to the worker's generation request and back.

Only the shape is checked here (types, `n`, content parts); the bounds on each parameter are the
worker's (worker/README.md, "Serving"), which answers a bad value with a 400 naming the field, so
a limit lives in one place. Fields OpenAI defines that we do not serve (`presence_penalty`,
`user`, …) are ignored, as llama.cpp's own server does: clients send them by default.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from app.errors import DomainError

CHAT, COMPLETION = "chat", "completion"
# The worker's fields that pass through as the client sent them.
SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "stop", "logit_bias")
# Worker error codes that are the request's fault (a 400 with the worker's words), and those that
# keep their own code (app/web_errors.py gives each its status); any other is GENERATION_FAILED.
CLIENT_FAULTS = frozenset({"WORKER_REQUEST_INVALID", "PROMPT_TOO_LONG", "WORKER_REQUEST_TOO_LARGE"})
KNOWN_FAILURES = frozenset({"WORKER_BUSY", "WORKER_DEPLOYMENT_NOT_READY", "WORKER_DEPLOYMENT_UNKNOWN"})


def invalid(param: str, why: str) -> DomainError:
    """400 in OpenAI's shape: `param` names the field."""
    return DomainError(
        "INVALID_PARAMETER",
        f"`{param}` {why}.",
        "Fix that field; see docs/serving.md for what each parameter accepts.",
        param=param,
    )


@dataclass(frozen=True)
class Completion:
    """A checked request: which model, the worker's generation body, and how to answer."""

    kind: str
    model: str
    request: dict
    stream: bool
    include_usage: bool


def _text_of(content: object, index: int) -> str:
    """A message's content: a string, or OpenAI's list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part, item in enumerate(content):
            if not isinstance(item, dict) or item.get("type") != "text" or not isinstance(item.get("text"), str):
                raise invalid(f"messages[{index}].content[{part}]", "must be a text part; only text is served")
            pieces.append(item["text"])
        return "".join(pieces)
    raise invalid(f"messages[{index}].content", "must be a string or a list of text parts")


def parse(kind: str, body: object) -> Completion:
    """Check an OpenAI request body's shape and translate it (S4)."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "must be the name of a deployment (GET /v1/models lists them)")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise invalid("stream_options", 'must be an object such as {"include_usage": true}')
    if body.get("n", 1) not in (1, None):
        raise invalid("n", "must be 1: one choice per request is served")
    request: dict[str, object] = {"kind": kind}
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("messages", "must be a non-empty list of messages")
        checked = []
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise invalid(f"messages[{index}]", "must be an object with `role` and `content`")
            role = "system" if message.get("role") == "developer" else message.get("role")
            checked.append({"role": role, "content": _text_of(message.get("content"), index)})
        request["messages"] = checked
        if body.get("max_completion_tokens") is not None:
            request["max_tokens"] = body["max_completion_tokens"]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise invalid("prompt", "must be a string (one prompt per request)")
        request["prompt"] = prompt
    for name in SAMPLING:
        if body.get(name) is not None and name not in request:
            request[name] = body[name]
    return Completion(kind, model, request, bool(stream), bool(options.get("include_usage", False)))


def failure(event: dict) -> DomainError:
    """A failed generation (a `request_failed` event) as the refusal the client gets."""
    code = event.get("code") if isinstance(event.get("code"), str) else "GENERATION_FAILED"
    message = str(event.get("message") or "the generation failed")[:1000]
    if code in CLIENT_FAULTS:
        return DomainError("INVALID_PARAMETER", message, "Fix the request; the message names what the model refused.")
    if code not in KNOWN_FAILURES:
        code = "GENERATION_FAILED"  # the engine's own failure (a crash, llama.cpp's error): 502
    return DomainError(code, message, "Retry shortly; if it persists, check the deployment's page.")


class Answer:
    """OpenAI's reply objects for one request: the whole answer, or its stream of chunks."""

    def __init__(self, completion: Completion) -> None:
        self.kind = completion.kind
        self.model = completion.model
        prefix = "chatcmpl" if self.kind == CHAT else "cmpl"
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.object = "chat.completion" if self.kind == CHAT else "text_completion"

    def _envelope(self, object_name: str, choices: list, **extra: object) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            **extra,
        }

    def whole(self, text: str, finished: dict) -> dict:
        """The non-streaming reply."""
        if self.kind == CHAT:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason(finished)
        return self._envelope(self.object, [choice], usage=finished.get("usage"))

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == CHAT else "text_completion"

    def opening(self) -> dict | None:
        """A chat stream's first chunk names the role; a completion stream has none."""
        if self.kind != CHAT:
            return None
        delta = {"role": "assistant", "content": ""}
        return self._envelope(
            self._chunk_object(), [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        )

    def piece(self, text: str) -> dict:
        """One chunk of text as it was generated."""
        if self.kind == CHAT:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return self._envelope(self._chunk_object(), [choice])

    def closing(self, finished: dict) -> dict:
        """The chunk that carries the finish reason."""
        if self.kind == CHAT:
            choice = {"index": 0, "delta": {}, "logprobs": None}
        else:
            choice = {"index": 0, "text": "", "logprobs": None}
        choice["finish_reason"] = finish_reason(finished)
        return self._envelope(self._chunk_object(), [choice])

    def usage(self, finished: dict) -> dict:
        """`stream_options.include_usage`: a last chunk with no choices and the counts."""
        return self._envelope(self._chunk_object(), [], usage=finished.get("usage"))


def finish_reason(finished: dict) -> str:
    """OpenAI's finish reasons: `stop` (end of text or a stop string) or `length`."""
    return "length" if finished.get("finish_reason") == "length" else "stop"
