#!/usr/bin/env python3
"""Assemble the Lua scripts in lua/ from one source (standard library only).

    python3 lua/build.py           write lua/<name>.lua for every lua/src/<name>.lua,
                                   and the client packages' copies (below)
    python3 lua/build.py --check   write nothing; exit 1 naming every committed
                                   generated file (lua/*.lua) that is missing,
                                   out of date or stray
    python3 lua/build.py --out DIR write only the scripts a client package ships
                                   into DIR (what the packages' build steps run)

lua/src/<name>.lua is a template: its text, with every line
`--@include <part>.lua` replaced by lua/src/parts/<part>.lua (expanded the
same way). A part is included once per script, where it is first named, so
each part names the parts it needs (tokenbucket.lua includes common.lua).
The output starts with a line saying it is generated (after the `#!lua`
line of a Functions library, which must come first).

A line `--@expand <part>.lua <ALG>` instantiates a template part for one
algorithm table ALG (TB, SL, SC) as straight-line code: a line
`--@inline [local] r_x, r_y = A.method(args)` (or a local function)
becomes that function's body in a `do ... end` block, the tables p and s
become locals p_<field> and s_<field>, A.<name> the algorithm's constant
(lua/README.md has the rules). Then every top-level local function or
table nothing refers to is left out: an EVAL script makes each function and
table it defines anew on every call.

The scripts that clients ship (EVAL/EVALSHA) are standalone: each carries
the parts it uses. library.lua is every limiter as one Redis Functions
library (FUNCTION LOAD) built from the same parts.

The client libraries ship the standalone scripts inside their packages
(clients/python/redis_ratelimit/lua/, clients/node/lua/). Those copies are
generated, not committed (docs/architecture.md, "Generated files"): the
Python package's build (clients/python/setup.py) and npm's prepack and
prepare scripts (clients/node/package.json) run `--out`, and `make` writes
them before the client tests. They are copies, not symbolic links, because
`npm pack` leaves a link out of the package. lua/*.lua are committed (users
load them straight from a checkout); `--check` (make lua-check, in make
test) keeps them equal to what lua/src makes.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
PARTS = os.path.join(SRC, "parts")
ROOT = os.path.dirname(HERE)
# Where the generated scripts go, and which of them: the client packages
# ship the EVAL scripts, not the Functions library.
# (folder, which scripts, committed): --check looks at the committed ones.
def ships(name):
    return name != "library.lua"


OUTPUTS = [
    ("lua", lambda name: True, True),
    ("clients/python/redis_ratelimit/lua", ships, False),
    ("clients/node/lua", ships, False),
]
INCLUDE = re.compile(r"^--@include ([A-Za-z0-9_.-]+\.lua)\s*$")
EXPAND = re.compile(r"^--@expand ([A-Za-z0-9_.-]+\.lua) ([A-Za-z_]\w*)\s*$")
INLINE = re.compile(r"^(\s*)--@inline (?:(local )?([\w, ]+?) = )?(A\.\w+|\w+)\((.*)\)\s*$")
DEF = re.compile(r"^(?:local function (\w+)|function (\w+\.\w+))\((.*)\)\s*$")
TABLE = re.compile(r"^local (\w+) = \{")
STRUCTS = ("p", "s")


class BuildError(SystemExit):
    pass


def fail(msg):
    raise BuildError("lua/build.py: " + msg)


def expand(text, seen, stack):
    out = []
    for line in text.splitlines(keepends=True):
        m = INCLUDE.match(line)
        e = EXPAND.match(line)
        if not m and not e:
            out.append(line)
            continue
        part = (m or e).group(1)
        if part in stack:
            fail("include cycle: %s" % " -> ".join(stack + [part]))
        if m and part in seen:
            continue
        if m:
            seen.add(part)
        with open(os.path.join(PARTS, part)) as f:
            body = expand(f.read(), seen, stack + [part])
        if not body.endswith("\n"):
            body += "\n"
        if e:
            # A template: its leading comment (what it is) stays in the part.
            lines = body.splitlines(keepends=True)
            while lines and (lines[0].startswith("--") or not lines[0].strip()):
                lines.pop(0)
            body = "--@region %s\n%s--@endregion\n" % (e.group(2), "".join(lines))
        out.append(body)
    return "".join(out)


def code_of(line, strings=False):
    """The code of a line: comment dropped, string literals emptied (kept
    with strings=True)."""
    out, i, n = [], 0, len(line)
    while i < n:
        c = line[i]
        if c in "'\"":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(line[i:j + 1] if strings else c + c)
            i = j + 1
        elif line.startswith("--", i):
            break
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_top(s):
    """s split at its top-level commas (outside brackets and strings)."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(s):
        c = s[i]
        if c in "'\"":
            j = s.index(c, i + 1)
            cur.append(s[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def ctor_fields(text):
    """[(name, expr)] of a table constructor's text `{a = x, b = y}`."""
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        fail("not a table constructor: " + text)
    fields = []
    for item in split_top(" ".join(inner[1:-1].split())):
        m = re.match(r"^([A-Za-z_]\w*) = (.+)$", item)
        if not m:
            fail("not a `name = value` field: " + item)
        fields.append((m.group(1), m.group(2)))
    return fields


def definitions(lines):
    """The top-level functions {name: (params, body lines)} and tables
    {name: {field: value}} of a script."""
    defs, tables = {}, {}
    i = 0
    while i < len(lines):
        m, t = DEF.match(lines[i]), TABLE.match(lines[i])
        if m:
            j = lines.index("end", i)
            defs[m.group(1) or m.group(2)] = ([a.strip() for a in m.group(3).split(",") if a.strip()],
                                              lines[i + 1:j])
            i = j + 1
        elif t:
            j = i
            while code_of(lines[j]).rstrip()[-1:] != "}":
                j += 1
            tables[t.group(1)] = dict(ctor_fields(" ".join(code_of(x, True) for x in lines[i:j + 1]).split(" = ", 1)[1]))
            i = j + 1
        else:
            i += 1
    return defs, tables


def struct_assign(name, ctor, indent):
    names, exprs = zip(*ctor_fields(ctor))
    return "%s%s = %s" % (indent, ", ".join("%s.%s" % (name, f) for f in names), ", ".join(exprs))


def inline(alg, method, outs, args, indent, defs, tables):
    """The body of alg.method as a `do ... end` block at the call site:
    parameters bound to the arguments, `return nil, e` (an error) returns e
    from the caller, the final `return x, y` assigns outs. A table of fields
    the method builds and returns as p or s becomes the caller's p.field /
    s.field variables."""
    fname = alg + "." + method if alg else method
    if fname not in defs:
        alias = tables.get(alg, {}).get(method)
        if alias not in defs:
            fail("no function %s to inline" % fname)
        fname = alias
    params, body = defs[fname]
    args = split_top(args)
    if len(args) != len(params):
        fail("%s takes %d arguments" % (fname, len(params)))
    body = list(body)
    # The final statement: a return of the results (possibly a multi-line
    # table constructor).
    last = len(body) - 1
    while last >= 0 and not code_of(body[last]).strip():
        last -= 1
    start = last
    while start > 0 and not code_of(body[start]).startswith("  return ") and code_of(body[start]).startswith("    "):
        start -= 1
    final = None
    if code_of(body[start]).startswith("  return "):
        final = " ".join(code_of(x, True).strip() for x in body[start:last + 1])[len("return "):]
        body = body[:start] + body[last + 1:]
    # The results are assigned inside the block: a local of the body with
    # the same name would take them instead.
    declared = set(params)
    for line in body:
        m = INLINE.match(line)
        if m and m.group(2):
            declared.update(n.strip() for n in m.group(3).split(","))
        for m in re.finditer(r"\blocal (?:function )?([\w, ]+)", code_of(line)):
            declared.update(n.strip() for n in m.group(1).split(","))
        for m in re.finditer(r"\bfor ([\w, ]+?) (?:=|in)\b", code_of(line)):
            declared.update(n.strip() for n in m.group(1).split(","))
    if declared & set(outs) - set(STRUCTS):
        fail("%s: name its results other than its locals %s" % (fname, sorted(declared & set(outs))))
    if any(re.search(r"\b[ps]_", code_of(line)) for line in body):
        fail("%s: p_ and s_ names are the callers'" % fname)
    out = []
    binds = [(p, a) for p, a in zip(params, args) if p not in STRUCTS]
    for p, a in zip(params, args):
        if p in STRUCTS and a != p:
            fail("%s: the table %s must be passed as %s" % (fname, p, p))
    if binds:
        out.append("  local %s = %s" % (", ".join(p for p, _ in binds), ", ".join(a for _, a in binds)))
    i = 0
    while i < len(body):
        line = body[i]
        if INLINE.match(line):
            out.extend(inline_line(INLINE.match(line), alg, defs, tables))
            i += 1
            continue
        code = code_of(line)
        m = re.match(r"^  local ([ps]) = (\{.*)$", code)
        if m and outs == [m.group(1)]:
            j = i
            while code_of(body[j]).rstrip()[-1:] != "}":
                j += 1
            ctor = " ".join(code_of(x, True).strip() for x in body[i:j + 1]).split(" = ", 1)[1]
            out.append(struct_assign(m.group(1), ctor, "  "))
            i = j + 1
            continue
        if re.search(r"(?<![\w.])(p|s)(?![\w.])", code):
            fail("%s: p and s may only be used as p.field and s.field" % fname)
        if re.search(r"\breturn\b", code):
            r = re.match(r"^(.*\breturn) nil, (.*)$", line)
            if not r:
                fail("%s: a return other than the last one must be `return nil, <error>`" % fname)
            line = r.group(1) + " " + r.group(2)
        out.append(line)
        i += 1
    if final is None:
        if outs:
            fail("%s returns nothing" % fname)
    elif not outs:
        fail("the results of %s are dropped" % fname)
    elif outs in (["p"], ["s"]):
        if final.startswith("{"):
            out.append(struct_assign(outs[0], final, "  "))
        elif final != outs[0]:
            fail("%s must return %s" % (fname, outs[0]))
    else:
        out.append("  %s = %s" % (", ".join(outs), final))
    return [indent + "do"] + [(indent + ln) if ln.strip() else "" for ln in out] + [indent + "end"]


def inline_line(m, alg, defs, tables, const=None):
    """The lines that replace one `--@inline` line (m: its INLINE match)."""
    indent, local, outs, method, args = m.groups()
    if method.startswith("A.") and alg is None:
        fail("A.%s outside a template" % method)
    if const:
        args = re.sub(r"(?<![\w.])A\.(\w+)", const, args)
    outs = [o.strip() for o in outs.split(",")] if outs else []
    if local and not set(outs).isdisjoint(STRUCTS):
        fail("a p or s result is declared by the region")
    out = ["%slocal %s" % (indent, ", ".join(outs))] if local else []
    alg_of = alg if method.startswith("A.") else None
    return out + inline(alg_of, method.split(".")[-1], outs, args, indent, defs, tables)


def instantiate(lines, alg, defs, tables):
    """A region of a template for one algorithm: A.m(...) calls on `--@inline`
    lines inlined, A.field replaced by the algorithm's constant, p.field and
    s.field made locals p_field and s_field."""
    consts = tables.get(alg)
    if consts is None:
        fail("no table " + alg)
    def const(m):
        v = consts.get(m.group(1))
        if v is None or not re.match(r"^('[^']*'|[0-9]+)$", v):
            fail("%s.%s is not a constant" % (alg, m.group(1)))
        return v

    out = []
    for line in lines:
        m = INLINE.match(line)
        if m:
            out.extend(inline_line(m, alg, defs, tables, const))
            continue
        out.append(re.sub(r"(?<![\w.])A\.(\w+)", const, line))
    text = "\n".join(out)
    text = re.sub(r"(?<![\w.'\"])(p|s)\.([A-Za-z_]\w*)", r"\1_\2", text)
    names = sorted(set(re.findall(r"(?<![\w.])([ps]_[A-Za-z_]\w*)", "\n".join(code_of(ln) for ln in text.split("\n")))))
    head = ["local " + ", ".join(names)] if names else []
    return head + text.split("\n")


def unused(lines):
    """Drop the top-level local functions and tables nothing refers to (an
    EVAL script creates every function it defines on every call)."""
    while True:
        blocks = {}  # name -> [(first, last)] line ranges, with their comments
        i = 0
        while i < len(lines):
            m, t = DEF.match(lines[i]), TABLE.match(lines[i])
            if m or t:
                j = lines.index("end", i) if m else i
                while t and code_of(lines[j]).rstrip()[-1:] != "}":
                    j += 1
                name = m.group(1) or m.group(2).split(".")[0] if m else t.group(1)
                first = i
                while first > 0 and lines[first - 1].startswith("--") and not lines[first - 1].startswith("--@"):
                    first -= 1
                blocks.setdefault(name, []).append((first, j))
                i = j + 1
            else:
                i += 1
        dead = None
        for name, ranges in blocks.items():
            inside = set(k for a, b in ranges for k in range(a, b + 1))
            rest = "\n".join(code_of(ln) for k, ln in enumerate(lines) if k not in inside)
            if not re.search(r"(?<![\w.])%s\b" % name, rest):
                dead = inside
                break
        if dead is None:
            return lines
        lines = [ln for k, ln in enumerate(lines) if k not in dead]


def build(name):
    """The generated text of lua/<name> from lua/src/<name>."""
    with open(os.path.join(SRC, name)) as f:
        lines = expand(f.read(), set(), []).split("\n")
    defs, tables = definitions(lines)
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^--@region (\w+)$", lines[i])
        if m:
            j = lines.index("--@endregion", i)
            out.extend(instantiate(lines[i + 1:j], m.group(1), defs, tables))
            i = j + 1
        elif INLINE.match(lines[i]):
            out.extend(inline_line(INLINE.match(lines[i]), None, defs, tables))
            i += 1
        else:
            out.append(lines[i])
            i += 1
    out = unused(out)
    if not out[0].startswith("#!"):
        # An EVAL script looks math.fmod up once per call, not on each of
        # the ten or so divisions (a Functions library cannot: its top level
        # runs without math).
        if any(re.search(r"(?<![\w.])fmod\b", code_of(ln)) for ln in out):
            fail("fmod is a name build.py gives math.fmod in EVAL scripts")
        first = next(k for k, ln in enumerate(out) if ln.strip() and not ln.startswith("--"))
        out = out[:first] + ["local fmod = math.fmod"] + [ln.replace("math.fmod(", "fmod(") for ln in out[first:]]
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)  # parts end and begin with a blank line
    mark = "-- Generated by lua/build.py from lua/src/%s and lua/src/parts/: do not edit.\n" % name
    if text.startswith("#!"):
        first, rest = text.split("\n", 1)
        return first + "\n" + mark + rest
    return mark + text


def targets():
    return sorted(n for n in os.listdir(SRC) if n.endswith(".lua"))


def main(argv):
    check = "--check" in argv
    outputs = OUTPUTS
    if "--out" in argv:
        i = argv.index("--out")
        if i + 1 >= len(argv) or check:
            print("usage: build.py [--check | --out DIR]", file=sys.stderr)
            return 2
        outputs = [(os.path.abspath(argv[i + 1]), ships, False)]
    elif check:
        outputs = [o for o in OUTPUTS if o[2]]
    stale = []
    texts = {name: build(name) for name in targets()}
    for out, wants, _ in outputs:
        wanted = {name for name in texts if wants(name)}
        folder = os.path.join(ROOT, out)
        if not check:
            os.makedirs(folder, exist_ok=True)
        for name in sorted(f for f in os.listdir(folder) if f.endswith(".lua") and f not in wanted):
            if check:  # a script that no template makes any more
                stale.append(out + "/" + name)
            else:
                os.remove(os.path.join(folder, name))
                print("removed " + out + "/" + name)
        for name in sorted(wanted):
            path = os.path.join(folder, name)
            try:
                with open(path) as f:
                    have = f.read()
            except FileNotFoundError:
                have = None
            if have == texts[name]:
                continue
            if check:
                stale.append(out + "/" + name)
            else:
                with open(path, "w") as f:
                    f.write(texts[name])
                print("wrote " + out + "/" + name)
    if stale:
        print("out of date (run `python3 lua/build.py`, never edit them by hand): " + " ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
