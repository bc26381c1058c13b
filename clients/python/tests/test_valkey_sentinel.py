"""valkey-py's Sentinel (valkey.sentinel.Sentinel(...).master_for()) as
redis-py's is taken (test_sentinel.py): refused while a sentinel client is
unbounded, and through a failover every decision bounded, panic while no
primary answers, the module again on the promoted replica. GLIDE has no
Sentinel client."""
import pytest
import valkey_drivers as vd
from test_sentinel import BUCKET, LONG, SYNC_BOUND, TIMEOUT_MS, _failover, breaker, settled

from redis_ratelimit import Panic, RateLimit

pytestmark = pytest.mark.skipif("valkey-py" not in vd.KINDS, reason="valkey-py not on "
                                "PYTHONPATH (make test-clients-py runs the valkey-py6 line)")


def test_unbounded_sentinel_client_is_refused():
    from valkey.sentinel import Sentinel
    s = Sentinel([("127.0.0.1", 1)], sentinel_kwargs={}, socket_timeout=0.1)
    with pytest.raises(ValueError, match=r"sentinel client for 127.0.0.1:1.*sentinel_kwargs.*"
                                         r"socket_timeout"):
        RateLimit(s.master_for("mymaster"))
    b = {"socket_timeout": 0.1}
    RateLimit(Sentinel([("127.0.0.1", 1)], sentinel_kwargs=b, **b).master_for("mymaster"))


@pytest.fixture
def deployment(server_factory):
    from sentinels import Deployment
    d = Deployment(server_factory)
    settled(d.primary)
    yield d
    d.close()


def test_sync_failover_module(deployment):
    from sentinels import SERVICE
    from valkey.sentinel import Sentinel
    t = TIMEOUT_MS / 1000
    s = Sentinel(deployment.addrs, sentinel_kwargs={"socket_timeout": t}, socket_timeout=t)
    rl = RateLimit(s.master_for(SERVICE), breaker=breaker())
    lim = rl.limiter(BUCKET, panic=Panic(limit=5, window_ms=LONG))
    dec, _ = _failover(deployment, lambda: lim.limit("k"), SYNC_BOUND, "module")
    assert dec.allowed and dec.remaining <= 1000 - 11       # the state carried over
    assert rl.metrics()["trips"] >= 1 and rl.backend == "module"
