"""The Python library's side of the Java client's differential test
(DifferentialTest.java): one JSON request a line on stdin, one answer a
line on stdout (tab-separated fields, then the headers). The rules are
the same as the Java test's."""
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


def line(d, extra=None):
    parts = ";".join(",".join(str(x) for x in p.as_tuple()) for p in d.parts)
    fields = [int(d.allowed), d.granted, d.limit, d.remaining, d.retry_after_ms, d.reset_after_ms,
              d.policy, d.binding, d.source, parts]
    h = "\x1f".join(f"{k}: {v}" for k, v in headers(d).items())
    return "\t".join(str(f) for f in fields) + "\t" + h + ("\t" + extra if extra is not None else "")


def main():
    rl = RateLimit.from_url(sys.argv[1], timeout_ms=2000)
    lims = {n: rl.limiter(r) for n, r in RULES.items()}
    for raw in sys.stdin:
        q = json.loads(raw)
        if q["op"] == "headers":        # the headers and 429 body of a decision given field by field
            x = q["decision"]
            d = Decision(allowed=x["allowed"], granted=x["granted"], limit=x["limit"],
                         remaining=x["remaining"], retry_after_ms=x["retry_after_ms"],
                         reset_after_ms=x["reset_after_ms"], policy=x["policy"], binding=x["binding"],
                         source=x["source"], parts=tuple(Part(*p) for p in x["parts"]),
                         rule=RULES[q["rule"]])
            body = json.dumps(problem(d, q["instance"]), ensure_ascii=False)
            print(line(d, body), flush=True)
            continue
        lim = lims[q["rule"]]
        if q["op"] == "refund":
            d = lim.refund(q["key"], q["n"])
        else:
            d = lim.limit(q["key"], cost=q["cost"], partial=q["partial"], dry_run=q["dry_run"])
        print(line(d), flush=True)


if __name__ == "__main__":
    main()
