"""Print the server x suite matrix of a `make test-py` run.

    python integration/matrix.py DIR

DIR holds one pytest junit-xml file per server (NAME.xml, written by
`pytest --junitxml`) and `times` (lines "NAME SECONDS EXIT"). Prints, per suite
file and server, passed/failed/skipped counts, then each server's totals and
wall time. Exits 1 when any test failed or errored, or a server's run left
no report (pytest crashed or could not start).
"""
import os
import sys
import xml.etree.ElementTree as ET


def suite_counts(path):
    """{suite file: [passed, failed, skipped]} from one junit-xml report."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        suite = case.get("classname", "?").split(".")[0] + ".py"
        row = out.setdefault(suite, [0, 0, 0])
        if case.find("failure") is not None or case.find("error") is not None:
            row[1] += 1
        elif case.find("skipped") is not None:
            row[2] += 1
        else:
            row[0] += 1
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = argv[1]
    runs = []  # (server, seconds, exit status)
    with open(os.path.join(d, "times")) as f:
        for line in f:
            name, secs, rc = line.split()
            runs.append((name, int(secs), int(rc)))
    counts, bad = {}, False
    for name, _, rc in runs:
        path = os.path.join(d, f"{name}.xml")
        if os.path.exists(path):
            counts[name] = suite_counts(path)
        else:
            counts[name] = None
            bad = True
        # pytest exits 0 only when every test passed or was skipped (1: some
        # failed; 2-5: interrupted, internal or usage error, nothing collected).
        bad |= rc != 0
    suites = sorted({s for c in counts.values() if c for s in c})
    names = [n for n, _, _ in runs]
    width = max([len(s) for s in suites] + [len("suite"), len("total")])
    col = max(14, *(len(n) + 2 for n in names))

    def cell(row):
        if row is None:
            return "-"
        p, f, s = row
        return f"{p}/{f}/{s}" + (" FAIL" if f else "")

    print()
    print("Integration matrix: passed/failed/skipped per suite and server")
    print("suite".ljust(width) + "".join(n.rjust(col) for n in names))
    for s in suites:
        print(s.ljust(width) + "".join(
            cell(counts[n].get(s) if counts[n] else None).rjust(col) for n in names))
    totals = []
    for n in names:
        c = counts[n]
        totals.append(None if c is None else [sum(r[i] for r in c.values()) for i in range(3)])
        bad |= bool(totals[-1] and totals[-1][1])
    print("total".ljust(width) + "".join(cell(t).rjust(col) for t in totals))
    print("time".ljust(width) + "".join(f"{secs}s".rjust(col) for _, secs, _ in runs))
    for (n, _, rc), t in zip(runs, totals):
        if t is None:
            print(f"{n}: no report (pytest exit status {rc})")
        elif rc not in (0, 1):
            print(f"{n}: pytest exit status {rc}")
    print("RESULT:", "FAILED" if bad else "all passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
