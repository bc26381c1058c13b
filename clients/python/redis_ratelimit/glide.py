"""GLIDE, Valkey's Rust-core client, for RateLimit and AsyncRateLimit: the
asyncio GlideClient / GlideClusterClient (valkey-glide, package `glide`)
and the sync ones (valkey-glide-sync, package `glide_sync`).

The library speaks redis-py's interface: execute_command(*args), a
pipeline for strict mode, redis-py's exception types. An adapter here
presents a GLIDE client that way, so that every path of the library
(module detection, the Lua twins with EVALSHA then EVAL, leases, the
breaker and panic limits, strict mode) runs unchanged on it:

- every command goes through GLIDE's custom_command; on a cluster client it
  is routed to the primary of the key's slot (SlotKeyRoute: GLIDE does not
  know where an RL.* command's key is); MOVED/ASK and the slot map are
  GLIDE's own business;
- the module is detected with COMMAND LIST FILTERBY PATTERN rl.*: GLIDE
  2.6 cannot parse COMMAND INFO's RESP3 reply (SystemError in its parser);
- GLIDE's errors become redis-py's: its TimeoutError, ConnectionError,
  ClosingError and CircuitBreakerError an outage; a server error by its
  code, so that core.is_outage classifies BUSY, LOADING, READONLY,
  CLUSTERDOWN... as it does for redis-py, and NOSCRIPT is NoScriptError.

The bound. AsyncRateLimit bounds each call itself (asyncio.wait_for), so an
asyncio GLIDE client is taken whatever its settings. A sync client's call
blocks in GLIDE's core until its `request_timeout` (GLIDE's default: 250
ms) expires, which covers a reconnect too (measured: 30-40 ms for a 30 ms
timeout after the server was killed and its port answered by a process that
never replies), except for a lazy_connect client's first connect, which only
`connection_timeout` bounds (GLIDE's default 2000 ms: measured 2002-2054
ms): such a client is refused unless connection_timeout <= request_timeout.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import redis.exceptions as rx

Shape = Optional[Callable[[Any], Any]]

_GLIDE_DEFAULT_REQUEST_TIMEOUT_MS = 250
_GLIDE_DEFAULT_CONNECTION_TIMEOUT_MS = 2000

# "An error was signalled by the server: - Kind: text" (the core's error
# kinds) -> the server's error code, which core.is_outage reads
_KIND_CODE = {"BusyLoadingError": "LOADING", "TryAgain": "TRYAGAIN", "ClusterDown": "CLUSTERDOWN",
              "MasterDown": "MASTERDOWN", "ReadOnly": "READONLY", "CrossSlot": "CROSSSLOT",
              "NotBusy": "NOTBUSY", "ExecAbortError": "EXECABORT"}
_SERVER = re.compile(r"An error was signalled by the server: - (\w+): (.*)", re.S)
_CODE = re.compile(r"([A-Z][A-Z_-]+): (.*)", re.S)      # "NOREPLICAS: text"


def package_of(client: Any) -> Optional[str]:
    """"glide" (asyncio) or "glide_sync" for a GLIDE client, else None."""
    pkg = type(client).__module__.split(".")[0]
    if pkg in ("glide", "glide_sync") and hasattr(client, "custom_command"):
        return pkg
    return None


def translate(exc: BaseException) -> Exception:
    """GLIDE's exception as the redis-py exception the library classifies."""
    name, msg = type(exc).__name__, str(exc)
    if name == "TimeoutError":
        return rx.TimeoutError(msg)
    if name in ("ConnectionError", "ClosingError", "CircuitBreakerError"):
        return rx.ConnectionError(f"{name}: {msg}")
    m = _SERVER.match(msg)
    if m:
        kind, text = m.groups()
        if kind == "NoScriptError":
            return rx.NoScriptError(text)
        code = _KIND_CODE.get(kind)
        return rx.ResponseError(f"{code} {text}" if code else text)
    m = _CODE.match(msg)
    if m:
        return rx.ResponseError(f"{m.group(1)} {m.group(2)}")
    if "IoError" in msg or "connect" in msg.lower():     # "Standalone connect failed - IoError"
        return rx.ConnectionError(msg)
    return rx.ResponseError(msg)


def _key_of(args: Sequence[Any]) -> Any:
    """The key a command is routed by (None: any node will do)."""
    name = str(args[0]).upper()
    if name == "RL.MULTI":
        return args[2]
    if name in ("EVAL", "EVALSHA"):
        return args[3] if int(args[2]) > 0 else None
    if name.startswith("RL."):
        return args[1]
    return None


def _is_detect(args: Sequence[Any]) -> bool:
    """core's module detection: COMMAND INFO RL.TOKENBUCKET RL.MULTI RL.FIXEDWINDOW."""
    return " ".join(str(a) for a in args).upper() == "COMMAND INFO RL.TOKENBUCKET RL.MULTI RL.FIXEDWINDOW"


def _detected(names: Any) -> List[Optional[bytes]]:
    """COMMAND LIST FILTERBY PATTERN rl.* -> COMMAND INFO's shape for core."""
    have = {(n.decode() if isinstance(n, bytes) else n).lower() for n in names or ()}
    return [b"rl.tokenbucket" if "rl.tokenbucket" in have else None,
            b"rl.multi" if "rl.multi" in have else None,
            b"rl.fixedwindow" if "rl.fixedwindow" in have else None]


_DETECT = ["COMMAND", "LIST", "FILTERBY", "PATTERN", "rl.*"]


class _Adapter:
    """What the sync and asyncio adapters share: the command as GLIDE takes
    it and its route."""

    def __init__(self, client: Any, pkg: str) -> None:
        self.glide = client                     # the GLIDE client itself
        self._pkg = importlib.import_module(pkg)
        self.cluster = isinstance(client, self._pkg.GlideClusterClient)
        self._config: Any = getattr(client, "config", None) or getattr(client, "_config", None)

    def _command(self, args: Sequence[Any]) -> Tuple[List[Any], Dict[str, Any], Shape]:
        """(GLIDE's args, its custom_command kwargs, how to shape the reply)."""
        if _is_detect(args):
            route: Dict[str, Any] = {"route": self._pkg.RandomNode()} if self.cluster else {}
            return list(_DETECT), route, _detected
        cmd = [str(a) if isinstance(a, int) else a for a in args]
        kw: Dict[str, Any] = {}
        if self.cluster:
            key = _key_of(cmd)
            kw["route"] = (self._pkg.RandomNode() if key is None else
                           self._pkg.SlotKeyRoute(self._pkg.SlotType.PRIMARY, key))
        return cmd, kw, None

    def _batch(self, cmds: Sequence[Sequence[Any]]) -> Any:
        batch = self._pkg.Batch(is_atomic=False)
        for args in cmds:
            batch.custom_command([str(a) if isinstance(a, int) else a for a in args])
        return batch

    @staticmethod
    def _replies(replies: Sequence[Any]) -> List[Any]:
        return [translate(r) if isinstance(r, Exception) else r for r in replies]

    def _glide_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._pkg.GlideError)


class SyncGlide(_Adapter):
    """A glide_sync client, as RateLimit uses it (execute_command, pipeline)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, "glide_sync")
        cfg = self._config
        ms = cfg.request_timeout or _GLIDE_DEFAULT_REQUEST_TIMEOUT_MS
        self.timeout_s = ms / 1000

    def unbounded(self) -> Optional[str]:
        """Why a call on this client could wait longer than its request_timeout, or None."""
        cfg = self._config
        ms = cfg.request_timeout or _GLIDE_DEFAULT_REQUEST_TIMEOUT_MS
        adv = getattr(cfg, "advanced_config", None)
        connect = getattr(adv, "connection_timeout", None) or _GLIDE_DEFAULT_CONNECTION_TIMEOUT_MS
        if getattr(cfg, "lazy_connect", None) and connect > ms:
            kind = "GlideClusterClient" if self.cluster else "GlideClient"
            conf = "AdvancedGlideClusterClientConfiguration" if self.cluster else \
                "AdvancedGlideClientConfiguration"
            return (f"RateLimit refuses this glide_sync {kind}: it has lazy_connect=True and its "
                    f"connection_timeout ({connect} ms; GLIDE's default is 2000 ms) is longer "
                    f"than its request_timeout ({ms} ms), and a lazy client's first connect "
                    "is bounded by connection_timeout alone, so one decision could wait that "
                    f"long: give advanced_config={conf}(connection_timeout={ms}) or less, or "
                    "leave lazy_connect unset")
        return None

    def execute_command(self, *args: Any) -> Any:
        cmd, kw, shape = self._command(args)
        try:
            reply = self.glide.custom_command(cmd, **kw)
        except Exception as e:
            if self._glide_error(e):
                raise translate(e) from e
            raise
        return shape(reply) if shape else reply

    def pipeline(self, transaction: bool = False) -> _SyncPipeline:
        return _SyncPipeline(self)


class _SyncPipeline:
    """Strict mode's pipeline: a non-atomic GLIDE Batch on the client's one
    connection (standalone only), so WAIT follows the call there."""

    def __init__(self, adapter: _Adapter) -> None:
        self.adapter = adapter
        self.cmds: List[Sequence[Any]] = []

    def execute_command(self, *args: Any) -> None:
        self.cmds.append(args)

    def execute(self, raise_on_error: bool = True) -> Any:
        a = self.adapter
        try:
            replies = a.glide.exec(a._batch(self.cmds), raise_on_error=False)
        except Exception as e:
            if a._glide_error(e):
                raise translate(e) from e
            raise
        return a._replies(replies)


class AsyncGlide(_Adapter):
    """A glide (asyncio) client, as AsyncRateLimit uses it."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, "glide")

    async def execute_command(self, *args: Any) -> Any:
        cmd, kw, shape = self._command(args)
        try:
            reply = await self.glide.custom_command(cmd, **kw)
        except Exception as e:
            if self._glide_error(e):
                raise translate(e) from e
            raise
        return shape(reply) if shape else reply

    def pipeline(self, transaction: bool = False) -> _AsyncPipeline:
        return _AsyncPipeline(self)


class _AsyncPipeline(_SyncPipeline):
    async def execute(self, raise_on_error: bool = True) -> Any:
        a = self.adapter
        try:
            replies = await a.glide.exec(a._batch(self.cmds), raise_on_error=False)
        except Exception as e:
            if a._glide_error(e):
                raise translate(e) from e
            raise
        return a._replies(replies)


def adapt_sync(client: Any) -> Any:
    """RateLimit's client: a glide_sync client adapted (ValueError when it
    could wait longer than its request_timeout), an asyncio one refused,
    any other returned as it is."""
    pkg = package_of(client)
    if pkg is None:
        return client
    if pkg == "glide":
        raise ValueError(f"{type(client).__name__} from glide (valkey-glide) is an asyncio "
                         "client: use AsyncRateLimit, or glide_sync's client "
                         "(valkey-glide-sync) with RateLimit")
    adapter = SyncGlide(client)
    why = adapter.unbounded()
    if why is not None:
        raise ValueError(why)
    return adapter


def adapt_async(client: Any) -> Any:
    """AsyncRateLimit's client: a glide client adapted, a glide_sync one
    refused, any other returned as it is."""
    pkg = package_of(client)
    if pkg is None:
        return client
    if pkg == "glide_sync":
        raise ValueError(f"{type(client).__name__} from glide_sync (valkey-glide-sync) is a "
                         "sync client: use RateLimit, or glide's asyncio client "
                         "(valkey-glide) with AsyncRateLimit")
    return AsyncGlide(client)


def is_cluster(client: Any) -> bool:
    return isinstance(client, _Adapter) and client.cluster
