"""The client families whose types the library recognises: redis-py (always
installed) and valkey-py (`valkey`, the redis-py fork, when installed). Both
have the same API and the same exception tree under different modules, so
the library takes either through the same code; these tuples are what its
isinstance checks and `except` clauses name. GLIDE's clients are adapted
to redis-py's types instead (glide.py)."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Optional, Tuple, Type

import redis
import redis.asyncio.cluster
import redis.cluster

valkey: Optional[ModuleType]
try:
    import valkey
    import valkey.asyncio.cluster
    import valkey.cluster
except ImportError:     # valkey-py is optional
    valkey = None

_FAMILIES: Tuple[ModuleType, ...] = (redis,) if valkey is None else (redis, valkey)
Types = Tuple[Type[Exception], ...]


def _each(path: str) -> Types:
    """The class at `path` (e.g. "exceptions.ResponseError") of every family."""
    out = []
    for mod in _FAMILIES:
        obj: Any = mod
        for part in path.split("."):
            obj = getattr(obj, part)
        out.append(obj)
    return tuple(out)


RESPONSE_ERROR = _each("exceptions.ResponseError")
NOSCRIPT = _each("exceptions.NoScriptError")
REDIRECT = _each("exceptions.MovedError") + _each("exceptions.AskError")
# Redis cannot answer now: down, slow, busy, failing over (core.is_outage)
OUTAGE: Types = (_each("exceptions.ConnectionError") + _each("exceptions.TimeoutError")
          + _each("exceptions.ClusterError") + _each("exceptions.ClusterDownError")
          + _each("exceptions.TryAgainError") + _each("exceptions.ReadOnlyError")
          + (redis.exceptions.RedisClusterException,)
          + (() if valkey is None else (valkey.exceptions.ValkeyClusterException,)))
SYNC_CLUSTER: Tuple[Any, ...] = (redis.cluster.RedisCluster,) + \
    (() if valkey is None else (valkey.cluster.ValkeyCluster,))
ASYNC_CLUSTER: Tuple[Any, ...] = (redis.asyncio.cluster.RedisCluster,) + \
    (() if valkey is None else (valkey.asyncio.cluster.ValkeyCluster,))


def node_client(cluster: Any, key: Any) -> Any:
    """The client a sync cluster client keeps for the node that holds `key`'s
    slot (redis-py: get_redis_connection, valkey-py: get_valkey_connection)."""
    get = getattr(cluster, "get_redis_connection", None) or cluster.get_valkey_connection
    return get(cluster.get_node_from_key(key))


def random_node_client(cluster: Any) -> Any:
    get = getattr(cluster, "get_redis_connection", None) or cluster.get_valkey_connection
    return get(cluster.get_random_node())


def family_of(client: Any) -> str:
    """"valkey" or "redis": the package whose Retry/NoBackoff a refusal names."""
    return "valkey" if type(client).__module__.startswith("valkey") else "redis"
