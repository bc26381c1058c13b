"""A Starlette app behind RateLimitMiddleware, served by uvicorn (a real
HTTP server) for test_asgi.py:  python asgi_app.py HTTP_PORT REDIS_PORT"""
import sys

import redis.asyncio
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from redis_ratelimit import AsyncRateLimit, sliding_log, token_bucket
from redis_ratelimit.asgi import RateLimitMiddleware

http_port, redis_port = int(sys.argv[1]), int(sys.argv[2])
HOUR = 3_600_000

rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=redis_port), timeout_ms=500)
api = rl.limiter(token_bucket("api", 3, 1, HOUR))
login = rl.leased(sliding_log("login", 4, HOUR), batch=2)


async def hello(request):
    return JSONResponse({"path": request.url.path})


app = Starlette(routes=[Route("/api/{rest:path}", hello), Route("/login", hello,
                                                                 methods=["GET", "POST"]),
                        Route("/free", hello)])
app.add_middleware(RateLimitMiddleware, routes=[("/api/", api), ("/login", ["POST"], login)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=http_port, log_level="warning")
