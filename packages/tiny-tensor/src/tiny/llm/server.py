"""An OpenAI-compatible HTTP server for a loaded model: /v1/models, /v1/completions and /v1/chat/completions, each
with `stream: true` as server-sent events. Starlette on uvicorn (`pip install "tiny-tensor[llm]"`).

Requests wait in a queue and are answered one at a time (the model has one KV cache); generation runs on a worker
thread, so the server keeps accepting requests (and streaming) meanwhile. A malformed request is a 400 with a JSON
error body, as OpenAI's API answers, and the server goes on serving.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from tiny.llm import LLM

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover  (the extra is not installed)
    raise ImportError("the server runs on starlette and uvicorn: pip install 'tiny-tensor[llm]'") from e


class BadRequest(ValueError):
    """A request the server cannot answer: a 400 with this message."""


@dataclass(frozen=True)
class Params:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]


def app(model: LLM, name: str) -> Starlette:
    """The ASGI application serving `model` under the model id `name`."""
    turn = asyncio.Lock()  # one generation at a time: the others wait their turn

    async def models(_: Request) -> Response:
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "tiny"}
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(request: Request) -> Response:
        return await _answer(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _answer(request, chat=True)

    async def _answer(request: Request, chat: bool) -> Response:
        try:
            body = await _json(request)
            params = _params(model, body, chat)
        except BadRequest as e:
            return _error(str(e), 400)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if body.get("stream"):
            return StreamingResponse(_events(model, params, chat, rid, name, turn), media_type="text/event-stream")
        # (shielded: a client that goes away does not release the turn while its generation still runs)
        text, count, finish = await asyncio.shield(asyncio.ensure_future(_locked(turn, _complete, model, params)))
        usage = {"prompt_tokens": len(params.prompt_ids), "completion_tokens": count}
        usage["total_tokens"] = usage["prompt_tokens"] + count
        head = {"id": rid, "created": int(time.time()), "model": name, "usage": usage}
        if chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            return JSONResponse({**head, "object": "chat.completion", "choices": [choice]})
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return JSONResponse({**head, "object": "text_completion", "choices": [choice]})

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _error(message: str, status: int) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": None}}, status)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _params(model: LLM, body: dict[str, Any], chat: bool) -> Params:
    tok = model.tokenizer
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise BadRequest("each message must be an object with a string 'role' and a string 'content'")
        ids = tok.encode(model.format_chat(messages), add_special_tokens=False).ids
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = tok.encode(prompt).ids
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            ids = list(prompt)
        else:
            raise BadRequest("'prompt' must be a non-empty string or a list of token ids")
    limit = body.get("max_completion_tokens", body.get("max_tokens", 16 if not chat else None))
    room = model.max_context - len(ids)
    if limit is None:
        limit = room
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise BadRequest(f"'max_tokens' must be an integer >= 1, got {limit!r}")
    if len(ids) + limit > model.max_context:
        raise BadRequest(
            f"the prompt ({len(ids)} tokens) and max_tokens ({limit}) are past the context of {model.max_context}"
        )
    temperature, top_p, seed = body.get("temperature", 1.0), body.get("top_p", 1.0), body.get("seed")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise BadRequest(f"'temperature' must be a number from 0 to 2, got {temperature!r}")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise BadRequest(f"'top_p' must be a number in (0, 1], got {top_p!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest(f"'seed' must be an integer, got {seed!r}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    return Params(ids, limit, float(temperature), float(top_p), seed, stop)


def _pieces(model: LLM, p: Params) -> Iterator[tuple[str, str | None]]:
    """(text added, finish reason or None) as tokens come: "stop" at an end token or a stop string (cut before it),
    "length" at max_tokens."""
    tok = model.tokenizer
    new: list[int] = []
    shown = ""
    for token in model.stream(p.prompt_ids, p.max_tokens, p.temperature, 0, p.top_p, p.seed):
        if token in model.eos_token_ids:
            yield "", "stop"
            return
        new.append(token)
        text = tok.decode(new)
        if text.endswith("\ufffd"):
            continue  # part of a character: wait for the rest
        cut = min((i for s in p.stop if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            yield text[len(shown) : cut] if cut > len(shown) else "", "stop"
            return
        yield text[len(shown) :], None
        shown = text
    yield "", "length"


async def _locked(turn: asyncio.Lock, fn: Any, *args: Any) -> Any:
    async with turn:
        return await asyncio.to_thread(fn, *args)


def _complete(model: LLM, p: Params) -> tuple[str, int, str]:
    parts, finish, count = [], "length", 0
    for piece, reason in _pieces(model, p):
        parts.append(piece)
        count += reason is None
        if reason is not None:
            finish = reason
    return "".join(parts), count, finish


async def _events(model: LLM, p: Params, chat: bool, rid: str, name: str, turn: asyncio.Lock) -> AsyncIterator[str]:
    """Server-sent events of a streamed answer: a chunk per piece of text, then one with the finish reason, then
    [DONE]. The generation runs on a worker thread, in its turn, handing pieces over a queue; a client that goes away
    stops it at the next token, and the turn passes on once it has stopped."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, str | None] | BaseException] = asyncio.Queue()
    cancel = threading.Event()

    def work() -> None:
        try:
            for item in _pieces(model, p):
                loop.call_soon_threadsafe(queue.put_nowait, item)
                if cancel.is_set():
                    return
        except BaseException as e:  # noqa: BLE001  (handed to the event loop, which ends the stream)
            loop.call_soon_threadsafe(queue.put_nowait, e)

    producer = asyncio.ensure_future(_locked(turn, work))
    created, first = int(time.time()), True
    kind = "chat.completion.chunk" if chat else "text_completion"
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            piece, reason = item
            if chat:
                delta: dict[str, str] = {"role": "assistant"} if first else {}
                if piece:
                    delta["content"] = piece
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": piece, "finish_reason": reason, "logprobs": None}
            first = False
            chunk = {"id": rid, "object": kind, "created": created, "model": name, "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n"
            if reason is not None:
                yield "data: [DONE]\n\n"
                return
    finally:
        cancel.set()
        await asyncio.shield(producer)


def serve(model: LLM, name: str, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until interrupted."""
    import uvicorn

    uvicorn.run(app(model, name), host=host, port=port, log_level="warning")
