"""One server time per command: where the server exports the cached command
time (`RedisModule_CachedMicroseconds`: Redis 7.2+, Valkey), every RL call
inside one MULTI/EXEC or one Lua script decides with the same microsecond,
and that is the time from which the server takes the millisecond its own
expiry uses there. (Redis 7.0 lacks the function; the module then reads the
clock on each call, and this file is skipped with the reason.)

The probe is a bucket refilling 10^6 tokens per microsecond: a second call
even one microsecond after the first would find a refill. (The keys expire
2 ms later: expiries are read inside the same transaction or script.)"""
import pytest

from rltesting.replies import cached_time

C = 10**12  # capacity; refills C per second = 10^6 per microsecond
X = 10**9  # cost of each call: what 1 ms of refill brings back
BUCKET = [C, C, 1000]


@pytest.fixture
def rc(r):
    if not cached_time(r):
        reason = "Redis before 7.2 has no RedisModule_CachedMicroseconds: each call reads the clock"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    return r


def test_calls_in_one_transaction_share_one_time(rc):
    for i in range(20):
        k, t = f"multi:{i}", f"multi:{i}:t"
        p = rc.pipeline(transaction=True)
        p.set(t, "x", px=100_000)
        p.execute_command("RL.TOKENBUCKET", k, *BUCKET, "COST", X)
        p.execute_command("RL.TOKENBUCKET", k, *BUCKET, "COST", X)
        p.pexpiretime(k)
        p.pexpiretime(t)
        _, first, second, k_at, t_at = p.execute()
        assert first[:3] == [1, C, C - X]
        assert second[:3] == [1, C, C - 2 * X], f"the second call saw a later time: {second}"
        # The expiry is counted from the millisecond the server's own
        # relative expiry (PX) used in the same transaction.
        assert k_at - second[4] == t_at - 100_000


SCRIPT = """
redis.call('SET', KEYS[2], 'x', 'PX', 100000)
local a = redis.call('RL.TOKENBUCKET', KEYS[1], ARGV[1], ARGV[2], ARGV[3], 'COST', ARGV[4])
local b = redis.call('RL.TOKENBUCKET', KEYS[1], ARGV[1], ARGV[2], ARGV[3], 'COST', ARGV[4])
return {a, b, redis.call('PEXPIRETIME', KEYS[1]), redis.call('PEXPIRETIME', KEYS[2])}
"""


def test_calls_in_one_script_share_one_time(rc):
    for i in range(20):
        k, t = f"{{lua{i}}}", f"{{lua{i}}}:t"
        first, second, k_at, t_at = rc.eval(SCRIPT, 2, k, t, *BUCKET, X)
        assert first[:3] == [1, C, C - X]
        assert second[:3] == [1, C, C - 2 * X], f"the second call saw a later time: {second}"
        assert k_at - second[4] == t_at - 100_000
