"""The OpenAI-compatible HTTP front of a :class:`~swarmjax.serve.hub.Hub`, on aiohttp.

``POST /v1/chat/completions`` checks the request (:func:`~swarmjax.serve.protocol.check_request`),
finds its episode (the ``X-Episode-Id`` header, else the ``user`` field) and hands it to
the episode's queue; the reply comes back when the engine has sampled the turn. ``GET
/v1/models`` lists the one model. Every error is OpenAI's error object with its status
(400 malformed, 401 bad key, 404 unknown model or episode, 409 a request already
awaiting, 410 episode over, 413 body too large), and a refused request changes no stream.
With ``stream=true`` a reply goes out as server-sent events (``data: <chunk>`` lines, then
``data: [DONE]``: :func:`~swarmjax.serve.protocol.completion_chunks`); an error before the
reply is still one JSON error object.

Safe by default: it binds to 127.0.0.1, ``api_key`` requires ``Authorization: Bearer
<key>`` (compared in constant time), bodies are bounded (``max_body`` bytes, and
``max_messages``), and an episode's key is 128 random bits that only its harness holds.

aiohttp (a maintained asyncio HTTP stack) serves from a thread of its own, so a training
job's engine thread and the harnesses' threads stay as they are.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading

from swarmjax.serve.hub import Hub
from swarmjax.serve.protocol import APIError, check_request, completion_chunks

__all__ = ["HarnessServer"]

EPISODE_HEADER = "X-Episode-Id"
AGENT_HEADER = "X-Agent-Id"       # a sub-agent's requests: its name (none: the harness's own agent)


class HarnessServer:
    """An HTTP server over ``hub`` in a background thread (module docstring).

    >>> server = HarnessServer(hub, model="swarmjax").start()
    >>> openai.OpenAI(base_url=server.base_url, api_key="-", default_headers={EPISODE_HEADER: ep.key})

    Args:
      hub: the episodes requests are routed to.
      model: the model name requests must name.
      host, port: where to listen (port 0: a free one; ``base_url`` tells which).
      api_key: when given, requests must carry it as a bearer token.
      max_body: the largest request body, in bytes.
      max_messages: the most messages a request may hold.
    """

    def __init__(self, hub: Hub, *, model: str, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, max_body: int = 8 << 20, max_messages: int = 4096):
        self.hub, self.model, self.host, self.port = hub, model, host, port
        self.api_key, self.max_body, self.max_messages = api_key, max_body, max_messages
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self.requests = 0                       # answered with 200
        self.errors = 0                         # answered with an error object

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, what an OpenAI client takes as ``base_url``."""
        return f"http://{self.host}:{self.port}/v1"

    # ------------------------------------------------------------------ handlers
    def _check_key(self, request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        if not secrets.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", code="invalid_api_key")

    async def _chat(self, request):
        from aiohttp import web

        self._check_key(request)
        try:
            body = await request.json(loads=json.loads)
        except web.HTTPRequestEntityTooLarge:
            raise APIError(413, f"the request body is larger than {self.max_body} bytes",
                           code="request_too_large") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not JSON: {e}") from None
        req = check_request(body, model=self.model, max_messages=self.max_messages)
        episode = self.hub.get(request.headers.get(EPISODE_HEADER) or req.user)
        loop = asyncio.get_running_loop()
        reply: asyncio.Future = loop.create_future()

        def respond(status: int, out: dict) -> None:
            loop.call_soon_threadsafe(lambda: reply.done() or reply.set_result((status, out)))

        episode.submit(req, respond, agent=request.headers.get(AGENT_HEADER) or None)
        status, out = await reply
        if status != 200:
            self.errors += 1
            return web.json_response(out, status=status)
        self.requests += 1
        if not req.stream:
            return web.json_response(out)
        events = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await events.prepare(request)
        for chunk in completion_chunks(out, include_usage=req.include_usage):
            await events.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
        await events.write(b"data: [DONE]\n\n")
        await events.write_eof()
        return events

    async def _models(self, request):
        from aiohttp import web

        self._check_key(request)
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model",
                                                              "owned_by": "swarmjax"}]})

    def _app(self):
        from aiohttp import web

        @web.middleware
        async def errors(request, handler):
            try:
                return await handler(request)
            except APIError as e:
                self.errors += 1
                return web.json_response(e.body(), status=e.status)
            except web.HTTPException as e:           # no such route, wrong method, ...
                if e.status < 400:
                    raise
                self.errors += 1
                return web.json_response(APIError(e.status, e.reason).body(), status=e.status)

        app = web.Application(client_max_size=self.max_body, middlewares=[errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    # ------------------------------------------------------------------ lifetime
    def start(self) -> HarnessServer:
        """Serve from a background thread; returns once it listens."""
        from aiohttp import web

        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve():
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                self._runner = web.AppRunner(self._app(), access_log=None)
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, self.host, self.port)
                loop.run_until_complete(site.start())
                self.port = self._runner.addresses[0][1]
            except BaseException as e:  # noqa: BLE001 - reported to the caller of start()
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="swarmjax-serve", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise OSError(f"swarmjax serve: cannot listen on {self.host}:{self.port}: {failure[0]}") from failure[0]
        return self

    def stop(self) -> None:
        """Stop serving (requests in flight are dropped)."""
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> HarnessServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
