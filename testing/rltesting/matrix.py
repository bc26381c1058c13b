"""Print the suite x run matrix of junit-xml test reports: the integration
suites per server (make test-py) and the client libraries per driver line
and server (make test-clients-py, make test-clients-node).

    python -m rltesting.matrix TITLE DIR

DIR/times has one line per run, "NAME SECONDS EXIT" (NAME: a server, e.g.
redis7.0, or driver@server, e.g. redis-py8@valkey9.1 or
ioredis6+node-redis6@redis7.0). A run's results are junit-xml files:
DIR/NAME.xml (pytest: one suite per test module) or DIR/NAME/*.xml (one file
per suite, named after it: node --test, one test file at a time). Prints
passed/failed/skipped per suite and run, the totals and each run's wall
time; exits 1 when a test failed or errored, a run exited non-zero (pytest:
1 some failed, 2-5 interrupted, internal or usage error, nothing collected),
or a run left no report (it crashed or could not start).
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


def module_of(classname):
    """pytest's classname (test_commands, tests.test_bound, or
    tests.test_x.TestY) -> test_commands.py, test_bound.py, test_x.py"""
    parts = classname.split(".")
    return next((p for p in parts if p.startswith("test_")), parts[-1]) + ".py"


def counts(path, suite=None):
    """{suite: [passed, failed, skipped]} of one junit-xml file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        s = suite or module_of(case.get("classname", "?"))
        row = out.setdefault(s, [0, 0, 0])
        if case.find("failure") is not None or case.find("error") is not None:
            row[1] += 1
        elif case.find("skipped") is not None:
            row[2] += 1
        else:
            row[0] += 1
    return out


def run_counts(d, name):
    files = [(p, None) for p in glob.glob(os.path.join(d, f"{glob.escape(name)}.xml"))]
    files += [(p, os.path.basename(p)[:-4])
              for p in sorted(glob.glob(os.path.join(d, glob.escape(name), "*.xml")))]
    if not files:
        return None
    out = {}
    for p, suite in files:
        try:
            got = counts(p, suite)
        except ET.ParseError:
            got = {suite or os.path.basename(p): [0, 1, 0]}   # a run cut short
        for s, row in got.items():
            acc = out.setdefault(s, [0, 0, 0])
            for i in range(3):
                acc[i] += row[i]
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    title, d = argv[1], argv[2]
    runs = []
    with open(os.path.join(d, "times")) as f:
        for line in f:
            name, secs, rc = line.split()
            runs.append((name, int(secs), int(rc)))
    res = {name: run_counts(d, name) for name, _, _ in runs}
    bad = any(rc != 0 or res[name] is None for name, _, rc in runs)
    suites = sorted({s for c in res.values() if c for s in c})
    names = [n for n, _, _ in runs]
    width = max([len(s) for s in suites] + [len("suite")])
    col = max(14, *(len(n) + 2 for n in names))

    def cell(row):
        if row is None:
            return "-"
        return f"{row[0]}/{row[1]}/{row[2]}" + (" FAIL" if row[1] else "")

    print()
    print(f"{title}: passed/failed/skipped per suite and run")
    print("suite".ljust(width) + "".join(n.rjust(col) for n in names))
    for s in suites:
        print(s.ljust(width) + "".join(
            cell(res[n].get(s) if res[n] else None).rjust(col) for n in names))
    totals = [None if res[n] is None else [sum(r[i] for r in res[n].values()) for i in range(3)]
              for n in names]
    bad |= any(t is not None and t[1] for t in totals)
    print("total".ljust(width) + "".join(cell(t).rjust(col) for t in totals))
    print("time".ljust(width) + "".join(f"{secs}s".rjust(col) for _, secs, _ in runs))
    print(f"{len(runs)} runs, {sum(secs for _, secs, _ in runs)} s in all")
    for (n, _, rc), t in zip(runs, totals):
        if t is None:
            print(f"{n}: no report (exit status {rc})")
        elif rc != 0:
            print(f"{n}: exit status {rc}")
    print("RESULT:", "FAILED" if bad else "all passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
