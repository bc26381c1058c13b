"""Conservation of RL.CONCURRENCY under load (integration/leaseload.py):
3 client processes of 64 workers each on one key, workers abandoning
leases (crashes) and one process killed with SIGKILL and started again;
every call timed on the server's clock. Held units never exceed the limit,
every denial had enough possible holders (no lease outlived its lease_ms),
and once the last lease could have lapsed the key is gone. Slow: 12 s of
load (RL_LOAD_SECONDS)."""
import os

import pytest

import leaseload


@pytest.mark.slow
def test_held_units_never_exceed_the_limit_and_lapsed_leases_free(server, tmp_path):
    seconds = float(os.environ.get("RL_LOAD_SECONDS", "12"))
    # the workers' logs (192 files) in pytest's temporary directory, not /tmp
    out = leaseload.run(server.port, limit=32, lease_ms=300, seconds=seconds, processes=3, workers=64,
                        crash=0.03, hold_ms=40, logdir=str(tmp_path))
    print(out)
    assert out["most_surely_held"] <= out["limit"], out
    assert out["unjustified_denials"] == 0, out
    assert out["key_gone_after_last_lease"], out
    # The load did what it claims: contention, crashes, a killed process.
    assert out["granted"] > 1000 and out["denied"] > 100, out
    assert out["abandoned"] > 10 and out["kills"] == 1, out
    assert out["most_surely_held"] >= out["limit"] // 2, out
