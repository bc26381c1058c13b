"""The model-agreement corpus: calls replayed through both sets of
reference models, the Rust ones (crates/ratelimit-core/src/reference/, by
its test `reference::agreement`) and the Python ones (models.py, and
fwmodels.py for the fixed window, by test_model_agreement.py). Each side
compares its replies with the ones written in the corpus, so a change of
either side's models fails a test.

The corpus (crates/ratelimit-core/src/reference/corpus.txt) was generated
once by `python integration/model_corpus.py --write`, its replies by the
Python models; the Rust test found them equal. Regenerate only on purpose
(a change of the contract), and then both tests must pass again.

Format, one item a line (`#` starts a comment line):

    case single SPEC
    case multi SPEC*WEIGHT SPEC*WEIGHT ...
    call T_US take COST PARTIAL DRYRUN = REPLY
    call T_US refund N = REPLY
    call T_US acquire ID COST PARTIAL DRYRUN = REPLY     (RL.CONCURRENCY)
    call T_US release ID = REPLY
    call T_US renew ID = REPLY

SPEC is `tb:capacity:rate:period_ms`, `sl:limit:window_ms`,
`sc:limit:window_ms` or `fw:limit:window_ms:fromfirst` (0/1), or for
RL.CONCURRENCY `cc:limit:lease_ms` (its calls name their id, a small
integer the Rust models take as the id's hash) and in RL.MULTI
`cc:limit:lease_ms:id`; PARTIAL,
DRYRUN are 0/1. A single command's REPLY is its five integers; RL.MULTI's
is its first six (allowed, limit, remaining, retry, reset, binding index)
then `;` and each limit's five, all as the commands reply them (saturated
at 2^63 - 1). Each case starts from no key; its calls run in order on one
key (or one key per limit).

One difference is known and left out: a clock that steps back behind a
token bucket's or a sliding log's state. The Rust models count the gap
into the waits, as the module does; models.py measures them from the
stored instant, as the Lua twins do. So the clock steps back only in cases
without those two (sliding counter and fixed window: both count the gap).

The RL.CONCURRENCY cases were added after the others, from their own seed
(`generate_concurrency`), so the lines before them did not change.
"""

import os
import random
import sys

import fwmodels
import models
from rltesting.payloads import MAX_ARG as MAX

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "ratelimit-core", "src",
                      "reference", "corpus.txt")


def model(spec):
    kind, *nums = spec.split(":")
    nums = [int(n) for n in nums]
    if kind == "tb":
        return models.TokenBucket(*nums)
    if kind == "sl":
        return models.SlidingLog(*nums)
    if kind == "sc":
        return models.SlidingCounter(*nums)
    if kind == "fw":
        return models.FixedWindow(nums[0], nums[1], bool(nums[2]))
    if kind == "cc":
        return models.Concurrency(nums[0], nums[1], nums[2] if len(nums) > 2 else None)
    raise ValueError(spec)


def parse(text):
    """[(kind, [(spec, weight)], [(t, op, args, reply)])] from the corpus text."""
    cases = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] == "case":
            if words[1] == "single":
                limits = [(words[2], 1)]
            else:
                limits = [(w.split("*")[0], int(w.split("*")[1])) for w in words[2:]]
            cases.append((words[1], limits, []))
        else:
            assert words[0] == "call", line
            left, right = line.split(" = ")
            w = left.split()
            t, op, args = int(w[1]), w[2], [int(x) for x in w[3:]]
            reply = [[int(x) for x in part.split()] for part in right.split(";")]
            cases[-1][2].append((t, op, args, reply))
    return cases


REPLY_MAX = 2**63 - 1


def sat(reply):
    """A reply's integers as the commands send them (saturated)."""
    return [min(x, REPLY_MAX) if isinstance(x, int) else x for x in reply]


def replay(kind, limits, calls):
    """The replies of models.py for one case's calls."""
    out = []
    if kind == "single" and limits[0][0].startswith("cc:"):
        _, limit, lease = (int(x) if i else x for i, x in enumerate(limits[0][0].split(":")))
        state = None
        for t, op, args in calls:
            m = models.Concurrency(limit, lease, args[0])
            if op == "acquire":
                _, cost, partial, dryrun = args
                reply, _, state = models.single(m, state, t, cost, bool(partial), bool(dryrun))
            elif op == "release":
                reply, _, state = models.single(m, state, t, refund=2**64)
            else:
                reply, _, state = models.cc_renew(m, state, t)
            out.append([sat(reply)])
        return out
    if kind == "single":
        m, state = model(limits[0][0]), None
        for t, op, args in calls:
            if op == "take":
                cost, partial, dryrun = args
                reply, _, state = models.single(m, state, t, cost, bool(partial), bool(dryrun))
            else:
                reply, _, state = models.single(m, state, t, refund=args[0])
            out.append([sat(reply)])
        return out
    ms = [model(s) for s, _ in limits]
    weights = [w for _, w in limits]
    states = [None] * len(ms)
    for t, op, args in calls:
        lims = [(m, s, w) for m, s, w in zip(ms, states, weights)]
        if op == "take":
            cost, partial, dryrun = args
            reply, _, states = models.multi(lims, t, cost, bool(partial), bool(dryrun))
        else:
            reply, _, states = models.multi(lims, t, refund=args[0])
        out.append([sat(reply[:6])] + [sat(p) for p in reply[6]])
    return out


def replay_fw(spec, calls):
    """The replies of fwmodels.py's FixedWindow (ms clock) for a single
    fixed-window case."""
    _, limit, window, first = (int(x) if i else x for i, x in enumerate(spec.split(":")))
    m, state, out = fwmodels.FixedWindow(limit, window, bool(first)), None, []
    for t, op, args in calls:
        if op == "take":
            cost, partial, dryrun = args
            reply, state = m.call(state, t // 1000, cost, bool(partial), bool(dryrun))
        else:
            reply, state = m.call(state, t // 1000, refund=args[0])
        out.append([sat(reply)])
    return out


# ---- generation ---------------------------------------------------------

def big(rng):
    """A large number, sometimes the largest accepted."""
    return rng.choice([MAX, MAX - 1, 2**40 + rng.randrange(1000), rng.randrange(10**9, 10**15)])


def spec(rng, kind, small):
    if kind == "tb":
        if small or rng.random() < 0.7:
            cap = rng.randrange(1, 40 if small else 12)
            return f"tb:{cap}:{rng.randrange(1, 2 * cap + 2)}:{rng.choice([1, 7, 100, 1000, 60000])}"
        return f"tb:{big(rng)}:{rng.choice([1, big(rng), rng.randrange(1, 10**6)])}:{rng.choice([1, 1000, big(rng)])}"
    limit = rng.randrange(1, 40 if small else 12) if small or rng.random() < 0.7 else big(rng)
    window = rng.choice([1, 3, 100, 1000, 60000]) if small or rng.random() < 0.7 else rng.choice([big(rng), 86400000])
    if kind == "fw":
        return f"fw:{limit}:{window}:{int(rng.random() < 0.3)}"
    return f"{kind}:{limit}:{window}"


def limit_of(s):
    return int(s.split(":")[1])


def window_us(s):
    kind, *n = s.split(":")
    return (int(n[2]) if kind == "tb" else int(n[1])) * 1000


def calls(rng, specs, n, multi, maxw=1):
    back = not any(s.startswith(("tb", "sl")) for s in specs)
    """n calls: the clock moving on by nothing, a little, about a window,
    past expiry (idle), or stepping back; takes (cost 0, 1, up to past the
    limit; PARTIAL, DRYRUN) and refunds."""
    top = min(limit_of(s) for s in specs)
    w = min(window_us(s) for s in specs)
    t = rng.choice([rng.randrange(1_600_000_000_000_000, 1_800_000_000_000_000), rng.randrange(0, 10**7)])
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.2:
            step = 0
        elif r < 0.5:
            step = rng.randrange(1, 2000)
        elif r < 0.8:
            step = rng.randrange(1, max(2, min(w, 10**12)))
        elif r < 0.95 or not back:
            step = min(w, 10**13) * rng.randrange(1, 4) + rng.randrange(0, 1000)
        else:
            step = -rng.randrange(1, 5000)
        t = max(0, t + step)
        if rng.random() < 0.15:
            n_ = rng.choice([1, rng.randrange(1, min(top, 50) + 2), top if top < MAX else MAX])
            out.append((t, "refund", [min(n_, MAX)]))
            continue
        hi = max(1, min(top // maxw, 20)) if multi else top
        c = rng.random()
        if c < 0.1:
            cost = 0
        elif c < 0.5:
            cost = 1
        elif c < 0.9 or multi:
            cost = rng.randrange(0, min(hi, 10**6) + 2)
        else:
            cost = rng.choice([top, min(top + 1, MAX), MAX])
        out.append((t, "take", [cost, int(rng.random() < 0.3), int(rng.random() < 0.15)]))
    return out


def cc_calls(rng, lease_us, n, top):
    """n RL.CONCURRENCY calls on ids 0..3: acquires (COST 0, 1, a few, past
    the limit; PARTIAL, DRYRUN), releases and renewals, the clock moving by
    nothing, a little, about a lease, past every lease, or stepping back."""
    t = rng.choice([rng.randrange(1_600_000_000_000_000, 1_800_000_000_000_000), rng.randrange(0, 10**7)])
    out = []
    for _ in range(n):
        r = rng.random()
        step = (0 if r < 0.2 else rng.randrange(1, 2000) if r < 0.45 else rng.randrange(1, max(2, lease_us))
                if r < 0.8 else lease_us * rng.randrange(1, 3) + rng.randrange(0, 1000) if r < 0.92
                else -rng.randrange(1, max(2, lease_us)))
        t = max(0, t + step)
        ident = rng.randrange(0, 4)
        r = rng.random()
        if r < 0.2:
            out.append((t, "release", [ident]))
        elif r < 0.32:
            out.append((t, "renew", [ident]))
        else:
            c = rng.random()
            cost = (0 if c < 0.08 else 1 if c < 0.5 else rng.randrange(1, min(top, 10**6) + 2) if c < 0.92
                    else rng.choice([top, min(top + 1, MAX), MAX]))
            out.append((t, "acquire", [ident, cost, int(rng.random() < 0.3), int(rng.random() < 0.12)]))
    return out


def generate_concurrency(seed=46, singles=60, multis=60):
    """The RL.CONCURRENCY cases: single keys, and RL.MULTI with a
    CONCURRENCY limit among others (the clock steps back only when
    there is no token bucket or log among them, as in the other cases)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(singles):
        limit = rng.randrange(1, 8) if rng.random() < 0.8 else big(rng)
        lease = rng.choice([1, 3, 100, 1000, 30000]) if rng.random() < 0.85 else big(rng)
        s = f"cc:{limit}:{lease}"
        cs = cc_calls(rng, min(lease * 1000, 10**13), rng.randrange(6, 24), limit)
        lines.append(f"case single {s}")
        for (t, op, args), reply in zip(cs, replay("single", [(s, 1)], cs)):
            lines.append(f"call {t} {op} {' '.join(map(str, args))} = {fmt_reply(reply)}")
    for _ in range(multis):
        specs = [spec(rng, rng.choice(["tb", "sl", "sc", "fw"]), small=True) for _ in range(rng.randrange(0, 3))]
        cc = f"cc:{rng.randrange(1, 12)}:{rng.choice([1, 100, 1000, 60000])}:{rng.randrange(0, 3)}"
        specs.insert(rng.randrange(0, len(specs) + 1), cc)
        ws = [rng.choice([1, 1, 2, 3]) for _ in specs]
        cs = calls(rng, specs, rng.randrange(4, 16), multi=True, maxw=max(ws))
        lines.append("case multi " + " ".join(f"{s}*{w}" for s, w in zip(specs, ws)))
        for (t, op, args), reply in zip(cs, replay("multi", list(zip(specs, ws)), cs)):
            lines.append(f"call {t} {op} {' '.join(map(str, args))} = {fmt_reply(reply)}")
    return lines


def fmt_reply(reply):
    return " ; ".join(" ".join(str(x) for x in part) for part in reply)


def generate(seed=42, per_kind=60, multis=120):
    rng = random.Random(seed)
    lines = []
    lines.append("# The model-agreement corpus: generated once by integration/model_corpus.py")
    lines.append("# (format there); replayed by reference::agreement (Rust) and")
    lines.append("# integration/test_model_agreement.py (Python). Do not edit by hand.")
    for kind in ["tb", "sl", "sc", "fw"]:
        for _ in range(per_kind):
            s = spec(rng, kind, small=False)
            cs = calls(rng, [s], rng.randrange(4, 16), multi=False)
            lines.append(f"case single {s}")
            for (t, op, args), reply in zip(cs, replay("single", [(s, 1)], cs)):
                lines.append(f"call {t} {op} {' '.join(map(str, args))} = {fmt_reply(reply)}")
    for _ in range(multis):
        specs = [spec(rng, rng.choice(["tb", "sl", "sc", "fw"]), small=True) for _ in range(rng.randrange(1, 5))]
        ws = [rng.choice([1, 1, 2, 3]) for _ in specs]
        cs = calls(rng, specs, rng.randrange(4, 16), multi=True, maxw=max(ws))
        lines.append("case multi " + " ".join(f"{s}*{w}" for s, w in zip(specs, ws)))
        for (t, op, args), reply in zip(cs, replay("multi", list(zip(specs, ws)), cs)):
            lines.append(f"call {t} {op} {' '.join(map(str, args))} = {fmt_reply(reply)}")
    lines.extend(generate_concurrency())
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = generate()
    if "--write" in sys.argv:
        with open(CORPUS, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
