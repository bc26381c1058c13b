#!/usr/bin/env python3
"""The layering check of the module crate (make lint).

Reads every `crate::` path in src/ (a `use crate::...` or a path written in
the code, `$crate::` of a macro excepted), maps each file to its top-level
module (src/api/host.rs is `api`, src/lib.rs is `lib`), and fails when
- a module of src/ has no layer below;
- a module imports one of a higher layer (the layers point one way: each
  imports only from its own layer or the ones before it);
- `api` imports anything but `ffi`, `alloc` and `clock`;
- the module graph has a cycle.
docs/architecture.md ("Layers") draws the same table. Python 3, stdlib only.
"""

import os
import re
import sys

# The layers of src/, lowest first; a module imports only from its own
# layer or a lower one.
LAYERS = [
    ["ffi", "alloc", "clock"],
    ["api"],
    ["value"],
    ["types"],
    ["stats", "listeners", "memusage"],
    ["commands"],
    ["cmdinfo"],
    ["lib"],
]
# What api/, the safe layer over the raw API, may import.
API_MAY_IMPORT = {"ffi", "alloc", "clock"}

RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}
PATH = re.compile(r"(?<![\w$])crate::(\{|\w+)")
COMMENT = re.compile(r"//[^\n]*")
STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def module_of(src, path):
    rel = os.path.relpath(path, src).replace(os.sep, "/")
    top = rel.split("/")[0]
    return top[:-3] if top.endswith(".rs") else top


def braced(text, start):
    """The top-level names of the `{...}` group opening at text[start]."""
    names, depth, i, item = [], 0, start, ""
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 1:
                item = ""
                i += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                names.append(item)
                break
        elif c == "," and depth == 1:
            names.append(item)
            item = ""
            i += 1
            continue
        if depth == 1:
            item += c
        i += 1
    out = []
    for n in names:
        m = re.match(r"\s*(\w+)", n)
        if m and m.group(1) != "self":
            out.append(m.group(1))
    return out


def imports(text):
    """(module, line) of every `crate::` path in one file's code."""
    code = STRING.sub('""', COMMENT.sub("", text))
    for m in PATH.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        if m.group(1) == "{":
            for name in braced(code, m.start(1)):
                yield name, line
        else:
            yield m.group(1), line


def graph(src):
    edges = {}  # (from, to) -> first "file:line"
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            me = module_of(src, path)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            for to, line in imports(text):
                if to != me:
                    edges.setdefault((me, to), "%s:%d" % (os.path.relpath(path), line))
    return edges


def cycle(edges):
    """One cycle of the graph as a list of modules, or None."""
    succ = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(succ.get(n, [])):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(succ):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def check(src):
    edges = graph(src)
    errors = []
    modules = {module_of(src, os.path.join(r, f)) for r, _, fs in os.walk(src) for f in fs if f.endswith(".rs")}
    for m in sorted(modules - set(RANK)):
        errors.append("src/%s has no layer: add it to LAYERS in tools/layers.py" % m)
    for (a, b), where in sorted(edges.items()):
        if a == "api" and b not in API_MAY_IMPORT:
            errors.append("%s: api imports crate::%s (api/ may import only %s)"
                          % (where, b, ", ".join(sorted(API_MAY_IMPORT))))
        elif a in RANK and b in RANK and RANK[b] > RANK[a]:
            errors.append("%s: %s imports crate::%s, a higher layer" % (where, a, b))
    c = cycle(edges)
    if c:
        errors.append("cycle: " + " -> ".join(c) + " (" + ", ".join(edges[(x, y)] for x, y in zip(c, c[1:])) + ")")
    return edges, errors


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    edges, errors = check(src)
    for e in errors:
        print("layers: " + e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print("layers: %d modules, %d imports, no cycle, each to its own layer or a lower one" % (len(RANK), len(edges)))


if __name__ == "__main__":
    main()
