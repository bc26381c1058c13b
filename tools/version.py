"""The project's version lives in one place, Cargo.toml ([workspace.package]
version); the client packages carry it. This checks that they do, or writes
it into them.

    python3 tools/version.py           check (exit 1, naming each file that differs)
    python3 tools/version.py --write   write Cargo.toml's version into every file

The files: clients/python/pyproject.toml (version), clients/python/
redis_ratelimit/__init__.py (__version__), clients/node/package.json and its
package-lock.json (the package's own version).
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cargo_version():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    m = re.search(r'^\[workspace\.package\]\s*\n(?:[^\[]*?\n)?version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("version.py: no [workspace.package] version in Cargo.toml")
    return m.group(1)


# (path, pattern whose group 1 is the version) for the text files
TEXT = [
    ("clients/python/pyproject.toml", r'^version\s*=\s*"([^"]+)"'),
    ("clients/python/redis_ratelimit/__init__.py", r'^__version__\s*=\s*"([^"]+)"'),
]


def found():
    """[(file, version found)] for every file that carries the version."""
    out = []
    for rel, pat in TEXT:
        m = re.search(pat, open(os.path.join(ROOT, rel)).read(), re.M)
        out.append((rel, m.group(1) if m else None))
    pkg = json.load(open(os.path.join(ROOT, "clients/node/package.json")))
    out.append(("clients/node/package.json", pkg.get("version")))
    lock = json.load(open(os.path.join(ROOT, "clients/node/package-lock.json")))
    out.append(("clients/node/package-lock.json", lock.get("version")))
    out.append(("clients/node/package-lock.json packages[\"\"]",
                lock.get("packages", {}).get("", {}).get("version")))
    return out


def write(v):
    for rel, pat in TEXT:
        p = os.path.join(ROOT, rel)
        text = open(p).read()
        new = re.sub(pat, lambda m: m.group(0).replace(m.group(1), v), text, count=1, flags=re.M)
        open(p, "w").write(new)
    for rel, keys in (("clients/node/package.json", [[]]),
                      ("clients/node/package-lock.json", [[], ["packages", ""]])):
        p = os.path.join(ROOT, rel)
        text = open(p).read()
        data = json.loads(text)
        for path in keys:
            d = data
            for k in path:
                d = d[k]
            d["version"] = v
        open(p, "w").write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def main(argv):
    v = cargo_version()
    if argv[1:] == ["--write"]:
        write(v)
    elif argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    bad = [(f, got) for f, got in found() if got != v]
    for f, got in bad:
        print(f"version.py: {f} has version {got}, Cargo.toml has {v} "
              "(python3 tools/version.py --write)", file=sys.stderr)
    if not bad:
        print(f"version {v}: Cargo.toml and both client packages agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
