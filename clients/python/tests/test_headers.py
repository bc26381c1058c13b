"""headers() and problem(): exact strings for granted, denied, all_of and
panic decisions; Retry-After is never 0 on a denial."""
import random

import pytest
from rltesting.proc import free_port
from support import client

from redis_ratelimit import (Breaker, Panic, RateLimit, all_of, headers, problem,
                             sliding_counter, sliding_log, token_bucket)

HOUR = 3_600_000


def test_granted_and_denied_exact(server):
    lim = RateLimit(client(server.port)).limiter(token_bucket("api", 3, 1, HOUR))
    # one token an hour; the calls run well within a second of each other
    d = lim.limit("rl:{a}:api")
    assert headers(d) == {
        "RateLimit-Policy": '"api";q=3;w=10800',
        "RateLimit": '"api";r=2;t=3600',
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "2",
        "X-RateLimit-Reset": "3600",
    }
    lim.limit("rl:{a}:api")
    lim.limit("rl:{a}:api")
    d = lim.limit("rl:{a}:api")
    assert not d.allowed and d.source == "module"
    assert list(headers(d).items()) == [
        ("RateLimit-Policy", '"api";q=3;w=10800'),
        ("RateLimit", '"api";r=0;t=10800'),
        ("X-RateLimit-Limit", "3"),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", "10800"),
        ("Retry-After", "3600"),
    ]
    assert problem(d, instance="/v1/items") == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": 'Rate limit "api" exceeded; retry in 3600 s.',
        "violated-policies": ["api"],
        "instance": "/v1/items",
    }
    # a cost above the limit can never be granted: no Retry-After, its own detail
    d = lim.limit("rl:{a}:api", cost=4)
    assert d.retry_after_ms == -1 and "Retry-After" not in headers(d)
    assert problem(d)["detail"] == 'Request costs more than the "api" limit allows.'


def test_panic_exact(server):
    server.kill9()
    rl = RateLimit(client(server.port, 0.05), breaker=Breaker(failures=1, open_ms=60_000))
    lim = rl.limiter(token_bucket("api", 10, 1, HOUR), panic=Panic(instances=2))
    d = lim.limit("rl:{a}:api")
    assert d.source == "panic" and d.allowed
    # panic limit 10 // 2 = 5 over the policy's window (10 h): 2 h per unit
    assert headers(d) == {
        "RateLimit-Policy": '"api";q=5;w=36000',
        "RateLimit": '"api";r=4;t=7200',
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "4",
        "X-RateLimit-Reset": "7200",
    }
    for _ in range(4):
        assert lim.limit("rl:{a}:api").allowed
    d = lim.limit("rl:{a}:api")
    h = headers(d)
    assert not d.allowed and h["RateLimit"] == '"api";r=0;t=36000'
    assert h["Retry-After"] == "7200"


def test_all_of_panic_exact(server):
    server.kill9()
    rl = RateLimit(client(server.port, 0.05), breaker=Breaker(failures=1, open_ms=60_000))
    # the bucket refills over a minute (a token every 12 s at the panic
    # limit): the calls below see it as they left it however slow they are
    pol = all_of(token_bucket("sec", 10, 10, 60_000), sliding_log("day", 1000, 86_400_000))
    lim = rl.limiter(pol, panic=Panic(instances=2))
    d = lim.limit("rl:{t}:u")
    assert d.source == "panic" and d.allowed and d.policy == "sec.day"
    assert d.binding == "sec"          # 4 whole requests left there, 499 in "day"
    assert headers(d) == {
        "RateLimit-Policy": '"sec";q=5;w=60, "day";q=500;w=86400',
        "RateLimit": '"sec";r=4;t=12',
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "4",
        "X-RateLimit-Reset": "12",
    }
    assert lim.limit("rl:{t}:u", cost=4).allowed
    d = lim.limit("rl:{t}:u")
    assert not d.allowed and d.binding == "sec"
    assert problem(d)["violated-policies"] == ["sec"]
    assert int(headers(d)["Retry-After"]) >= 1


@pytest.mark.parametrize("backend", ["module", "lua"])
def test_all_of_shared_exact(server, backend):
    rl = RateLimit(client(server.port), backend=backend)
    rl.detect()
    pol = all_of(token_bucket("burst", 5, 1, HOUR), sliding_log("day", 3, 86_400_000))
    lim = rl.limiter(pol)
    d = lim.limit("rl:{t}:u")
    assert d.allowed and d.binding == "day" and d.source == backend
    assert headers(d) == {
        "RateLimit-Policy": '"burst";q=5;w=18000, "day";q=3;w=86400',
        "RateLimit": '"day";r=2;t=86400',
        "X-RateLimit-Limit": "3",
        "X-RateLimit-Remaining": "2",
        "X-RateLimit-Reset": "86400",
    }
    lim.limit("rl:{t}:u", cost=2)
    d = lim.limit("rl:{t}:u")
    assert not d.allowed and d.binding == "day"
    assert problem(d)["violated-policies"] == ["day"]
    assert headers(d)["Retry-After"] == "86400"


@pytest.mark.parametrize("backend", ["module", "lua"])
def test_retry_after_never_zero_when_denied(server, backend):
    """Sub-second waits (one unit per ms) still say Retry-After: 1."""
    rl = RateLimit(client(server.port), backend=backend)
    rnd = random.Random(5)
    pols = [token_bucket("tb", 3, 1000, 1000), sliding_log("log", 3, 50),
            sliding_counter("cnt", 3, 50)]
    denials = 0
    # 600 calls, and more while 50 or fewer were denied (a loaded machine
    # calls more slowly, so the 50 ms windows slide further between calls),
    # up to 20,000
    for n in range(20_000):
        if n >= 600 and denials > 50:
            break
        p = rnd.choice(pols)
        d = rl.limiter(p).limit(f"rl:{{k}}:{p.name}", cost=rnd.choice([1, 2, 3]))
        if not d.allowed:
            denials += 1
            assert d.retry_after_ms >= 1
            assert int(headers(d)["Retry-After"]) >= 1
    assert denials > 50


def test_make_key_and_cross_slot():
    from redis_ratelimit import CrossSlotError, key_slot, make_key
    assert make_key("tenant42", "user7") == "rl:{tenant42}:user7"
    assert make_key("t", "a", "b", prefix="x") == "x:{t}:a:b"
    with pytest.raises(ValueError):
        make_key("a{b")
    pol = all_of(token_bucket("a", 1, 1, 1), token_bucket("b", 1, 1, 1))
    assert pol.keys("rl:{t}:u") == ["rl:{t}:u:a", "rl:{t}:u:b"]
    assert key_slot("rl:{t}:u:a") == key_slot("{t}")
    with pytest.raises(CrossSlotError):
        pol.keys(["rl:user1", "rl:user2"])
    # refused before any call: no server at this port
    rl = RateLimit(client(free_port(), 0.05))
    with pytest.raises(CrossSlotError):
        rl.limiter(pol).limit(["user:1", "tenant:2"])
    assert rl.metrics()["calls"] == 0


def test_all_of_default_name_is_a_valid_name():
    # the part names joined by "." ("+" is not a name character); the name
    # rule (1-64 of A-Z a-z 0-9 . _ -) holds for all_of names too
    import re
    pol = all_of(token_bucket("api", 1, 1, 1), sliding_log("day", 1, 1))
    assert pol.name == "api.day"
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", pol.name)
    with pytest.raises(ValueError):
        all_of(token_bucket("api", 1, 1, 1), name="api+day")
    long = [sliding_log(c * 40, 1, 1) for c in "ab"]
    with pytest.raises(ValueError, match="longer than 64 characters"):
        all_of(*long)
    assert all_of(*long, name="ab").name == "ab"
