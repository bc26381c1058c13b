"""ASGI middleware (Starlette, FastAPI, any ASGI app).

    app.add_middleware(RateLimitMiddleware, routes=[("/api/", limiter)])

Each request that matches a route (path prefix, optional methods; the first
match wins) is decided by that route's limiter under the key
`rl:{<caller>}:<policy name>`; the caller is the X-Api-Key header hashed,
else the client address. Every limited response carries headers(decision);
a denial is answered 429 with problem(decision) as application/problem+json.
Limiters come from AsyncRateLimit (awaited) or RateLimit (called inline:
a leased one decides without I/O)."""
from __future__ import annotations

import hashlib
import inspect
import json
from typing import (Any, Awaitable, Callable, Collection, List, MutableMapping, Optional,
                    Protocol, Sequence, Set, Tuple, Union)

from .decision import Decision, headers, problem
from .policies import AllOf, Policy, make_key

__all__ = ["RateLimitMiddleware", "default_caller", "RouteLimiter"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RouteLimiter(Protocol):
    """What a route takes: any limiter of this package (sync or asyncio,
    shared or leased)."""

    @property
    def policy(self) -> Union[Policy, AllOf]: ...

    def limit(self, key: str) -> Union[Decision, Awaitable[Decision]]: ...


#: (path prefix, limiter) or (path prefix, methods, limiter)
Route = Union[Tuple[str, RouteLimiter], Tuple[str, Collection[str], RouteLimiter]]


def default_caller(scope: Scope) -> str:
    """`key:<sha256(X-Api-Key)[:32]>`, else `ip:<client address>`."""
    for name, value in scope.get("headers") or ():
        if name == b"x-api-key" and value:
            return "key:" + hashlib.sha256(value).hexdigest()[:32]
    client = scope.get("client")
    return "ip:" + (client[0] if client else "unknown")


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, routes: Sequence[Route],
                 caller: Callable[[Scope], str] = default_caller, prefix: str = "rl") -> None:
        self.app = app
        self.routes: List[Tuple[str, Optional[Set[str]], RouteLimiter]] = []
        for r in routes:
            methods: Optional[Set[str]] = None
            if len(r) == 2:
                path, lim = r
            else:
                path, given, lim = r
                methods = {m.upper() for m in given}
            self.routes.append((path, methods, lim))
        self.caller = caller
        self.prefix = prefix

    def _route(self, method: str, path: str) -> Optional[RouteLimiter]:
        for p, methods, lim in self.routes:
            if (methods is None or method in methods) and \
                    (path == p or path.startswith(p if p.endswith("/") else p + "/")):
                return lim
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        lim = self._route(scope["method"], scope["path"])
        if lim is None:
            return await self.app(scope, receive, send)
        key = make_key(self.caller(scope), lim.policy.name, prefix=self.prefix)
        got = lim.limit(key)
        d = await got if inspect.isawaitable(got) else got
        extra = [(k.lower().encode(), v.encode()) for k, v in headers(d).items()]
        if not d.allowed:
            body = json.dumps(problem(d, instance=scope["path"])).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/problem+json"),
                                    (b"content-length", str(len(body)).encode()), *extra]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = dict(msg)
                msg["headers"] = [*msg.get("headers", ()), *extra]
            await send(msg)

        await self.app(scope, receive, send_with_headers)
