"""What a gateway does with the Python client library (clients/python),
against each image and against a server without the module (Lua twins):
a token bucket per request with the HTTP headers and the 429 body, RL.MULTI
through all_of, leases taken with PARTIAL by three gateway instances, and
REFUND (an explicit one and the leases given back on close)."""
import math

from redis_ratelimit import (RateLimit, all_of, headers, make_key, problem, sliding_counter,
                             sliding_log, token_bucket)


def test_gateway_calls(server):
    url, source = server
    rl = RateLimit.from_url(url, timeout_ms=1000)

    # A token bucket per request: 5, refilled at 5 a minute (one per 12 s).
    api = rl.limiter(token_bucket("api", capacity=5, rate=5, period_ms=60_000))
    key = make_key("alice", "api")
    ds = [api.limit(key) for _ in range(6)]
    assert [d.allowed for d in ds] == [True] * 5 + [False]
    assert {d.source for d in ds} == {source}
    h = headers(ds[0])
    assert h["RateLimit-Policy"] == '"api";q=5;w=60'
    assert (h["X-RateLimit-Limit"], h["X-RateLimit-Remaining"]) == ("5", "4")
    assert h["RateLimit"] == f'"api";r=4;t={h["X-RateLimit-Reset"]}' and "Retry-After" not in h
    assert 0 < ds[0].reset_after_ms <= 12_000
    denied = ds[-1]
    assert 0 < denied.retry_after_ms <= 12_000
    assert headers(denied)["Retry-After"] == str(math.ceil(denied.retry_after_ms / 1000))
    body = problem(denied, instance="/v1/items")
    assert (body["status"], body["violated-policies"], body["instance"]) == (429, ["api"], "/v1/items")
    # The request was not served after all: REFUND gives its unit back.
    assert api.refund(key, 1).granted == 1
    assert api.limit(key).allowed and not api.limit(key).allowed

    # RL.MULTI: a burst limit and an hourly one, all or nothing.
    login = rl.limiter(all_of(token_bucket("burst", 3, 1, 60_000),
                              sliding_log("hour", 10, 3_600_000), name="login"))
    lkey = make_key("bob", "login")
    ds = [login.limit(lkey) for _ in range(4)]
    assert [d.allowed for d in ds] == [True, True, True, False]
    assert {d.source for d in ds} == {source}
    assert ds[-1].binding == "burst"
    assert [p.policy for p in ds[-1].parts] == ["burst", "hour"]
    h = headers(ds[-1])
    assert h["RateLimit-Policy"] == '"burst";q=3;w=180, "hour";q=10;w=3600'
    assert h["RateLimit"].startswith('"burst";r=0;')
    # The refused call took nothing from the hourly limit: 7 units are
    # left (a DRYRUN of one answers what would remain after it: 6).
    hour = rl.limiter(sliding_log("hour", 10, 3_600_000))
    assert hour.limit(f"{lkey}:hour", dry_run=True).remaining == 6

    # Three gateway instances lease 10 units each of a shared 25 a minute:
    # the third lease is PARTIAL and gets the last 5. Each spends 2 (the
    # first on the lease's reply, the second from its reservoir). Closing
    # them gives the unused units back (REFUND): only the 6 spent stay taken.
    policy = sliding_counter("search", limit=25, window_ms=60_000)
    skey = make_key("carol", "search")
    instances = [RateLimit.from_url(url, timeout_ms=1000) for _ in range(3)]
    leased = [i.leased(policy, batch=10) for i in instances]
    first = [lim.limit(skey) for lim in leased]
    second = [lim.limit(skey) for lim in leased]
    assert all(d.allowed for d in first + second)
    assert {d.source for d in first} == {source}
    assert {d.source for d in second} == {"local"}
    assert [i.metrics()["lease_tokens"] for i in instances] == [10, 10, 5]
    assert second[2].remaining == 3
    shared = rl.limiter(policy)
    assert not shared.limit(skey, dry_run=True).allowed
    for lim in leased:
        lim.close()
    assert [i.metrics()["refund_tokens"] for i in instances] == [8, 8, 3]
    assert shared.limit(skey, dry_run=True).remaining == 19 - 1   # 19 left
    assert rl.metrics()[f"decisions_{source}"] > 0
