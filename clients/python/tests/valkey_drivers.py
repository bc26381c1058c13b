"""The Valkey client kinds the tests of test_valkey_clients.py run on: those
whose package is on PYTHONPATH (make test-clients-py puts one driver line
first: target/drivers/valkey-py6 has valkey-py, target/drivers/glide2 has
valkey-glide and valkey-glide-sync; a redis-py line has none, and the file
is skipped there).

    valkey-py        RateLimit(valkey.Valkey(socket_timeout=...)), as a new
                     user writes it (valkey-py does not retry by default)
    valkey-py-async  AsyncRateLimit(valkey.asyncio.Valkey(), timeout_ms=...)
    glide-sync       RateLimit(glide_sync.GlideClient(request_timeout=...))
    glide-async      AsyncRateLimit(glide.GlideClient(...), timeout_ms=...),
                     the client's own timeout 5 s and reconnect retries
                     without end: the library's bound is its own

Every call of a test goes through `await v(x)`, which awaits x for the
asyncio kinds and passes a sync call's result through."""
import asyncio
import inspect
import os

KINDS = []
try:
    import valkey
    import valkey.asyncio
    import valkey.asyncio.cluster
    import valkey.cluster
    KINDS += ["valkey-py", "valkey-py-async"]
except ImportError:
    valkey = None
try:
    import glide_sync
    KINDS.append("glide-sync")
except ImportError:
    glide_sync = None
try:
    import glide
    KINDS.append("glide-async")
except ImportError:
    glide = None

# RL_VALKEY_KINDS=a,b: only those (each driver line of make test-clients-py
# names its own: the virtualenv has valkey-py too, as the test servers' wheels need it)
if os.environ.get("RL_VALKEY_KINDS") is not None:
    KINDS = [k for k in KINDS if k in os.environ["RL_VALKEY_KINDS"].split(",")]

HOST = "127.0.0.1"


async def v(x):
    return await x if inspect.isawaitable(x) else x


def is_async(kind):
    return kind.endswith("-async")


def version(kind):
    if kind.startswith("valkey-py"):
        return f"valkey-py {valkey.__version__}"
    from importlib.metadata import version as dist
    return f"valkey-glide{'-sync' if kind == 'glide-sync' else ''} " \
           f"{dist('valkey-glide-sync' if kind == 'glide-sync' else 'valkey-glide')}"


async def raw_client(kind, port, timeout_ms, cluster=False):
    """The driver's client, bounded as the kind says."""
    t = timeout_ms / 1000
    if kind == "valkey-py":
        if cluster:
            return valkey.cluster.ValkeyCluster(host=HOST, port=port, socket_timeout=t,
                                                cluster_error_retry_attempts=0)
        return valkey.Valkey(host=HOST, port=port, socket_timeout=t)
    if kind == "valkey-py-async":
        if cluster:
            return valkey.asyncio.cluster.ValkeyCluster(host=HOST, port=port)
        return valkey.asyncio.Valkey(host=HOST, port=port)
    if kind == "glide-sync":
        g = glide_sync
        addrs = [g.NodeAddress(HOST, port)]
        if cluster:
            return g.GlideClusterClient.create(
                g.GlideClusterClientConfiguration(addrs, request_timeout=timeout_ms))
        return g.GlideClient.create(g.GlideClientConfiguration(addrs, request_timeout=timeout_ms))
    g = glide
    addrs = [g.NodeAddress(HOST, port)]
    kw = {"request_timeout": 5000,
          "reconnect_strategy": g.BackoffStrategy(num_of_retries=2**31 - 1, factor=1000,
                                                  exponent_base=2)}
    if cluster:
        return await g.GlideClusterClient.create(g.GlideClusterClientConfiguration(addrs, **kw))
    return await g.GlideClient.create(g.GlideClientConfiguration(addrs, **kw))


async def make(kind, port, timeout_ms, cluster=False, **kw):
    """(RateLimit or AsyncRateLimit on a new client of the kind, its closer)."""
    from redis_ratelimit import AsyncRateLimit, RateLimit
    last = None
    for _ in range(100):        # a 30 ms timeout can expire on a loaded machine's first connect
        try:
            c = await raw_client(kind, port, timeout_ms, cluster)
            break
        except Exception as e:  # noqa: BLE001 - GLIDE's create raises its own types
            last = e
            await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"no {kind} client: {last}")
    if is_async(kind):
        rl = AsyncRateLimit(c, timeout_ms=timeout_ms, **kw)
    else:
        rl = RateLimit(c, **kw)
    return rl, (lambda: close(kind, c))


async def close(kind, c):
    if kind.startswith("valkey-py"):
        await v(c.aclose() if is_async(kind) else c.close())
    else:
        await v(c.close())


async def first_from_module(kind, port, timeout_ms, policy, key, cluster=False, make_kw=None,
                            **lim_kw):
    """A RateLimit whose first decision came from the module within the
    timeout (a fresh breaker each try: a loaded machine's first call can
    time out, and that failure would count): (rl, limiter, closer)."""
    for _ in range(100):
        rl, closer = await make(kind, port, timeout_ms, cluster, **(make_kw or {}))
        lim = rl.limiter(policy, **lim_kw)
        try:
            if (await v(lim.limit(key))).source == "module":
                return rl, lim, closer
        except Exception:   # noqa: BLE001 - the detection timed out: again
            pass
        await closer()
    raise AssertionError("no decision from the module within the timeout in 100 tries")


async def module_again(lim, key):
    """Poll until the module decides for key again (after a stop, a kill or
    a busy script): up to 3,000 decisions, 10 ms apart."""
    for _ in range(3000):
        if (await v(lim.limit(key))).source == "module":
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the module never decided again")
