#!/usr/bin/env python3
"""Benchmarks: the three RL commands against INCR and against their Lua twins;
RL.MULTI's composition; RL.FIXEDWINDOW against envoyproxy/ratelimit's
INCRBY + EXPIRE pipeline (server time per decision).

    bench/bench.py [--server S]        full run (~7-10 min) on one server build:
                                       writes bench/results-TAG.json, the full
                                       report docs/bench/TAG.md with its chart
                                       docs/bench/TAG.svg, and BENCHMARKS.md
    bench/bench.py --quick --out DIR   tiny counts, same code paths (< 60 s):
                                       proves the script works, no timing checks
    bench/bench.py --render-only bench/results-TAG.json
                                       rewrite the reports from a saved run (no
                                       server)

S is a server binary or a name of rltesting.servers (redis7.0,
valkey8.1, valkey9.1); the default is $REDIS_SERVER or redis-server. TAG
names the build (redis7.0, valkey9.1, ...). BENCHMARKS.md holds one summary
table per server, from every bench/results-*.json there is, with the date of
each run.

One server (module loaded) on 127.0.0.1; redis-benchmark with 50
clients, pipeline 16 and 1, over random keys in 10,000 and 1,000,000 and over
one hot key. For every keyspace and algorithm the script warms the keys the
"denied" and "mix" regimes need, then runs, for each pipeline depth:
INCR, the RL command in its three regimes, INCR again, the Lua twin in its
three regimes. Every ratio compares runs made back to back in the same
block, because the machine (2 cores, shared with redis-benchmark and other
work) drifts. Then a replica is attached and the same block is run again.
Any error from the server, any missing figure or a regime that does not do
what it says (e.g. "denied" granting) makes the script exit non-zero.

This file is the command line: measure.py measures, report.py (with the
Markdown templates in bench/templates/) and svg.py write the reports.
"""

import argparse
import json
import os
import sys
import time

import measure
import report
from measure import ROOT, BenchError


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny counts: prove the script works")
    ap.add_argument("--out", default=ROOT, help="where BENCHMARKS.md, docs/bench/ and bench/results-*.json go")
    ap.add_argument("--render-only", metavar="RESULTS_JSON", help="only rewrite the report from saved results")
    ap.add_argument("--server", help="server binary or a name of rltesting.servers (default: REDIS_SERVER or redis-server)")
    ap.add_argument("--no-replica", action="store_true", help="skip the replica half of every block")
    ap.add_argument("--only-multi", action="store_true",
                    help="only the RL.MULTI cells (prints their table; writes no report)")
    ap.add_argument("--only-envoy", action="store_true",
                    help="only the RL.FIXEDWINDOW vs INCRBY + EXPIRE cells (prints their table; writes no report)")
    ap.add_argument("--algs", default="tb,sc,sl",
                    help="development only: a subset of tb,sc,sl (the report then has gaps and fails)")
    a = ap.parse_args()
    out = os.path.abspath(a.out)

    if a.render_only:
        with open(a.render_only) as f:
            data = json.load(f)
        data.setdefault("server_tag", measure.server_tag(data["machine"].get("redis_server", "")))
        report.write_outputs(data, out)
        print("wrote %s/BENCHMARKS.md and %s/docs/bench/%s.md" % (out, out, data["server_tag"]))
        return 0

    t0 = time.monotonic()

    def log(msg):
        print("[%6.1f s] %s" % (time.monotonic() - t0, msg), flush=True)

    data = measure.run(a.quick, a.server, a.no_replica, a.algs, a.only_multi, log, only_envoy=a.only_envoy)
    if a.only_multi:
        print("\n".join(report.Report(data).composition()))
        return 0
    if a.only_envoy:
        print("\n".join(report.Report(data).envoy()))
        return 0
    measure.save(data, out)
    report.write_outputs(data, out)
    tag = data["server_tag"]
    log("wrote %s/BENCHMARKS.md, %s/docs/bench/%s.md and .svg, %s/bench/results-%s.json" % (out, out, tag, out, tag))
    if data["problems"]:
        for p in data["problems"]:
            print("REGIME CHECK FAILED: " + p, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print("BENCHMARK FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
