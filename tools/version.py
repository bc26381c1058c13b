"""The project's version lives in one place, Cargo.toml ([workspace.package]
version); the client packages carry it. This checks that they do, or writes
it into them.

    python3 tools/version.py           check (exit 1, naming each file that differs)
    python3 tools/version.py --write   write Cargo.toml's version into every file

The files: clients/python/pyproject.toml (version), clients/python/
redis_ratelimit/__init__.py (__version__), clients/node/package.json and its
package-lock.json (the package's own version); the Java artifacts'
poms: clients/java/pom.xml (the parent's version), clients/java/client's
parent version, both Spring Cloud Gateway starters' own versions, and
examples/java's dependency on the starter.
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

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


# (pom, path of the element that carries the project's version); "dep:" names
# a dependency on one of the project's artifacts by its artifactId
POM_NS = "{http://maven.apache.org/POM/4.0.0}"
POMS = [
    ("clients/java/pom.xml", "version"),
    ("clients/java/client/pom.xml", "parent/version"),
    ("clients/java/spring-gateway4/pom.xml", "version"),
    ("clients/java/spring-gateway4/pom.xml", "dep:redis-ratelimit-client"),
    ("clients/java/spring-gateway5/pom.xml", "version"),
    ("clients/java/spring-gateway5/pom.xml", "dep:redis-ratelimit-client"),
    ("examples/java/pom.xml", "dep:redis-ratelimit-spring-gateway5"),
]


def pom_element(root, where):
    """The element of `where` under the pom's root, or None."""
    if where.startswith("dep:"):
        for d in root.iter(POM_NS + "dependency"):
            a = d.find(POM_NS + "artifactId")
            if a is not None and a.text == where[4:]:
                return d.find(POM_NS + "version")
        return None
    return root.find("/".join(POM_NS + part for part in where.split("/")))


def pom_version(rel, where):
    e = pom_element(ET.parse(os.path.join(ROOT, rel)).getroot(), where)
    return None if e is None else e.text


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
    for rel, where in POMS:
        out.append((f"{rel} ({where})", pom_version(rel, where)))
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
    for rel, where in POMS:
        # the text edited in place (ElementTree would rewrite the whole file):
        # the old version replaced once, inside the element's own line
        old = pom_version(rel, where)
        if old is None or old == v:
            continue
        p = os.path.join(ROOT, rel)
        lines = open(p).read().split("\n")
        tag = "<version>%s</version>" % old
        want = where.split(":")[-1].split("/")
        # the line of the version after the anchor (artifactId of the
        # project, of the parent block, or of the dependency)
        anchor = {"version": "<artifactId>", "parent/version": "<parent>"}.get(where, "<artifactId>%s</artifactId>" % want[0])
        start = 0
        if where == "version":
            # the project's own artifactId: the first one outside <parent>
            depth = 0
            for i, line in enumerate(lines):
                depth += line.count("<parent>") - line.count("</parent>")
                if depth == 0 and "<artifactId>" in line and "</parent>" not in line:
                    start = i
                    break
        else:
            start = next(i for i, line in enumerate(lines) if anchor in line)
        i = next(i for i in range(start, len(lines)) if tag in lines[i])
        lines[i] = lines[i].replace(tag, "<version>%s</version>" % v, 1)
        open(p, "w").write("\n".join(lines))


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
        print(f"version {v}: Cargo.toml, the Python and Node packages and the Java poms agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
