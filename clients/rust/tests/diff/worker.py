"""The Python library's side of the Rust client's differential test
(tests/differential.rs): one JSON request a line on stdin, one JSON answer
a line on stdout. The rules are the same as the Rust test's."""
import json
import sys

from redis_ratelimit import (Decision, Part, RateLimit, all_of, fixed_window, headers, problem, sliding_counter,
                             sliding_log, token_bucket)

HOUR = 3_600_000
RULES = {
    "tb": token_bucket("tb", 5, 1, HOUR),
    "log": sliding_log("log", 4, HOUR),
    "ctr": sliding_counter("ctr", 6, 2**40),
    "all": all_of(token_bucket("a", 3, 1, HOUR), sliding_log("b", 10, HOUR).weighted(2), name="all"),
    "fw": fixed_window("fw", 4, HOUR, from_first=True),
    "allfw": all_of(fixed_window("f", 6, 2**40), token_bucket("t", 4, 1, HOUR), name="allfw"),
}


def out(d):
    return {"allowed": d.allowed, "granted": d.granted, "limit": d.limit, "remaining": d.remaining,
            "retry_after_ms": d.retry_after_ms, "reset_after_ms": d.reset_after_ms,
            "policy": d.policy, "binding": d.binding, "source": d.source,
            "parts": [list(p.as_tuple()) for p in d.parts]}


def main():
    rl = RateLimit.from_url(sys.argv[1], timeout_ms=2000)
    lims = {n: rl.limiter(r) for n, r in RULES.items()}
    for line in sys.stdin:
        q = json.loads(line)
        if q["op"] == "headers":        # the headers and 429 body of a decision given field by field
            x = q["decision"]
            d = Decision(allowed=x["allowed"], granted=x["granted"], limit=x["limit"],
                         remaining=x["remaining"], retry_after_ms=x["retry_after_ms"],
                         reset_after_ms=x["reset_after_ms"], policy=x["policy"], binding=x["binding"],
                         source=x["source"], parts=tuple(Part(*p) for p in x["parts"]),
                         rule=RULES[q["rule"]])
            print(json.dumps({"headers": list(headers(d).items()), "problem": problem(d, q["instance"])}),
                  flush=True)
            continue
        lim = lims[q["rule"]]
        if q["op"] == "refund":
            d = lim.refund(q["key"], q["n"])
        else:
            d = lim.limit(q["key"], cost=q["cost"], partial=q["partial"], dry_run=q["dry_run"])
        print(json.dumps({"decision": out(d), "headers": list(headers(d).items())}), flush=True)


if __name__ == "__main__":
    main()
