#!/usr/bin/env python3
"""The layering check of the crates (make lint).

For each crate of CRATES (the module's src/, the service's service/src/,
the Rust client's clients/rust/src/),
reads every `crate::` path in its sources (a `use crate::...` or a path
written in the code, `$crate::` of a macro excepted), maps each file to its
top-level module (src/api/host.rs is `api`, src/lib.rs is `lib`), and fails
when
- a module has no layer in the crate's table;
- a module imports one of a higher layer (the layers point one way: each
  imports only from its own layer or the ones before it);
- a module with a restricted list imports anything else (the module's
  `api` may import only `ffi`, `alloc` and `clock`);
- the module graph has a cycle;
- a function is longer than the crate's bound, when it has one (the
  service's: 80 lines, from its `fn` line to its closing brace).
A crate is added by a row of CRATES. docs/architecture.md draws the same
tables. Python 3, stdlib only.
"""

import os
import re
import sys

# The layers of the module's src/, lowest first; a module imports only
# from its own layer or a lower one.
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

# The service's service/src/: a request goes plan -> backend -> respond,
# run by service; plan and respond are pure (neither reaches the backend
# nor a connection).
SERVICE_LAYERS = [
    [
        "error", "gosyntax", "tls", "mapper", "xds_settings", "upstream_settings",
        "overcache", "logger", "connage", "dynamic_metadata", "otlp_settings",
    ],
    ["otlp"],
    ["config", "settings", "metrics", "conn", "json", "trace"],
    ["plan"],
    ["spread"],
    ["backend"],
    ["respond"],
    ["service"],
    ["runtime", "statsd", "xds", "debug"],
    ["server"],
    ["main", "lib"],
]

# The pure steps of the service: what plan and respond may import (no
# backend, no connection, no listener).
SERVICE_PURE = {
    "plan": {"error", "config"},
    "respond": {"error", "config", "metrics", "plan", "settings", "dynamic_metadata"},
}

# The Rust client's clients/rust/src/: an I/O-free part (what a decision
# sends, how its reply reads, the reservoirs, the panic limits) under a
# transport (the connection, timeout, breaker calls, detection, strict
# mode) and what is built on it.
CLIENT_LAYERS = [
    ["error"],
    ["policy", "keys"],
    ["decision", "breaker"],
    ["headers", "request", "options", "metrics"],
    ["answer"],
    ["reservoir"],
    ["transport", "sentinel"],
    ["client"],
    ["lease", "reserve", "inflight"],
    ["tower"],
    ["lib"],
]
CLIENT_IO_FREE = {m for layer in CLIENT_LAYERS[:6] for m in layer}
# The I/O-free modules import only each other: never the transport.
CLIENT_PURE = {m: CLIENT_IO_FREE for m in CLIENT_IO_FREE}

# One row per crate: its sources (from the repository's root), its layers,
# the modules restricted to a list of imports, and its longest function
# (None: no bound).
CRATES = [
    {"src": "src", "layers": LAYERS, "only": {"api": API_MAY_IMPORT}, "max_fn_lines": None},
    {"src": "service/src", "layers": SERVICE_LAYERS, "only": SERVICE_PURE, "max_fn_lines": 80},
    {"src": "clients/rust/src", "layers": CLIENT_LAYERS, "only": CLIENT_PURE, "max_fn_lines": None},
]

PATH = re.compile(r"(?<![\w$])crate::(\{|\w+)")


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
    code = code_only(text)
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


FN = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)",
    re.M,
)
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")
RAW = re.compile(r'r(#*)"')


def code_only(text):
    """`text` with its comments, strings and char literals blanked (newlines
    kept, so that lines keep their numbers): what is left is Rust's code."""
    out, i, n = list(text), 0, len(text)

    def blank(j, k):
        for x in range(j, min(k, n)):
            if out[x] != "\n":
                out[x] = " "

    while i < n:
        c = text[i]
        word_before = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        raw = RAW.match(text, i) if c == "r" and not word_before else None
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif raw:
            end = text.find('"' + raw.group(1), raw.end())
            j = n if end < 0 else end + 1 + len(raw.group(1))
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif c == "'" and CHAR.match(text, i):
            j = CHAR.match(text, i).end()
        else:
            i += 1  # code (a lifetime's quote too)
            continue
        blank(i, j)
        i = j
    return "".join(out)


def long_functions(path, bound):
    """(name, first line, lines) of every function of `path` longer than `bound`."""
    with open(path, encoding="utf-8") as fh:
        code = code_only(fh.read())
    for m in FN.finditer(code):
        i, depth = m.end(), 0
        while i < len(code) and code[i] not in "{;":
            i += 1
        if i >= len(code) or code[i] == ";":
            continue  # a declaration without a body
        start = i
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = code.count("\n", 0, m.start()) + 1
        lines = code.count("\n", m.start(), i) + 1
        if lines > bound and start < i:
            yield m.group(1), first, lines


def check(src, layers, only, max_fn_lines):
    rank = {m: i for i, layer in enumerate(layers) for m in layer}
    edges = graph(src)
    errors = []
    shown = os.path.relpath(src)
    files = [os.path.join(r, f) for r, _, fs in os.walk(src) for f in sorted(fs) if f.endswith(".rs")]
    modules = {module_of(src, f) for f in files}
    for m in sorted(modules - set(rank)):
        errors.append("%s/%s has no layer: add it to its layers in tools/layers.py" % (shown, m))
    for (a, b), where in sorted(edges.items()):
        if a in only and b not in only[a]:
            errors.append("%s: %s imports crate::%s (%s/ may import only %s)"
                          % (where, a, b, a, ", ".join(sorted(only[a]))))
        elif a in rank and b in rank and rank[b] > rank[a]:
            errors.append("%s: %s imports crate::%s, a higher layer" % (where, a, b))
    c = cycle(edges)
    if c:
        errors.append("cycle: " + " -> ".join(c) + " (" + ", ".join(edges[(x, y)] for x, y in zip(c, c[1:])) + ")")
    if max_fn_lines is not None:
        for f in sorted(files):
            for name, line, n in long_functions(f, max_fn_lines):
                errors.append("%s:%d: fn %s is %d lines (at most %d in %s)"
                              % (os.path.relpath(f), line, name, n, max_fn_lines, shown))
    return edges, errors


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = CRATES
    if len(sys.argv) > 1:
        # `layers.py DIR [ROW]`: DIR checked with the row of CRATES whose src is
        # ROW (a copy of service/src: `layers.py /tmp/copy service/src`), else
        # the row of DIR itself, else the module's
        src = sys.argv[1]
        name = sys.argv[2] if len(sys.argv) > 2 else None
        row = [c for c in CRATES if c["src"] == name or (name is None and os.path.isdir(src)
               and os.path.samefile(os.path.join(root, c["src"]), src))]
        if name is not None and not row:
            sys.exit("layers: no row of CRATES has src %r" % name)
        crates = [dict(row[0] if row else CRATES[0], src=src)]
    failed = False
    for c in crates:
        src = c["src"] if os.path.isabs(c["src"]) or len(sys.argv) > 1 else os.path.join(root, c["src"])
        edges, errors = check(src, c["layers"], c["only"], c["max_fn_lines"])
        for e in errors:
            print("layers: " + e, file=sys.stderr)
        failed = failed or bool(errors)
        if not errors:
            bound = "" if c["max_fn_lines"] is None else ", no fn over %d lines" % c["max_fn_lines"]
            print("layers: %s: %d modules, %d imports, no cycle, each to its own layer or a lower one%s"
                  % (c["src"], sum(len(x) for x in c["layers"]), len(edges), bound))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
