"""Leases never exceed the shared limit, and idle refunds give stranded
units back: 4 processes x 2 leased limiters on one key, shared limit 1,000
per hour (sliding log, exact).

The counts are per window only if every grant falls inside one: a sliding
log's grants leave it a window after they were made, so the window is an
hour, beyond any run (each worker runs 3 s, communicate() gives up after
120 s). It was 10 s, which a run on a loaded machine could outlast."""
import json
import os
import subprocess
import sys

import pytest
from support import client

from redis_ratelimit import RateLimit, sliding_log

HERE = os.path.dirname(os.path.abspath(__file__))
POLICY = sliding_log("shared", 1000, 3_600_000)  # as in lease_worker.py


@pytest.mark.parametrize("backend", ["module", "lua"])
def test_four_processes_two_leased_limiters_each(server, tmp_path, backend):
    rl = RateLimit(client(server.port), backend=backend)
    key = "rl:{shared}:api"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "lease_worker.py"),
                               str(server.port), backend, key, str(go), "3.0"],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.write_text("go")
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    total = sum(o["granted"] for o in outs)
    firsts = [o["first"] for o in outs if o["first"] is not None]
    span = max(o["last"] for o in outs if o["last"] is not None) - min(firsts)
    # every grant fell inside one window, so the limit applies to the total
    assert span < 3600.0, span
    # on the server: units taken and not given back
    d = rl.limiter(POLICY).limit(key, cost=0)
    used = d.limit - d.remaining
    leased = sum(o["lease_tokens"] for o in outs)
    refunded = sum(o["refund_tokens"] for o in outs)
    print(f"\n{backend}: granted at callers {total} "
          f"(a {[o['a'] for o in outs]}, b {[o['b'] for o in outs]}), "
          f"stranded in idle B limiters {sum(o['held_b'] for o in outs)}, "
          f"used on the server {used}, leased {leased}, refunded {refunded}, "
          f"lease calls {sum(o['leases'] for o in outs)}, "
          f"refund calls {sum(o['refunds'] for o in outs)}, "
          f"decisions by A {sum(o['calls_a'] for o in outs)}")
    # the shared limit decided every grant (no failure, no trip: panic
    # grants are local), else the totals below say nothing
    assert all(o["failures"] == 0 and o["trips"] == 0 for o in outs), outs
    assert total <= 1000
    assert used == total == leased - refunded      # every leased unit used or given back
    assert all(o["failures"] == 0 for o in outs)
    # the idle B limiters held units; without their refunds A could not reach 950
    assert sum(o["held_b"] for o in outs) == 4 * 45
    assert total >= 950, total
