"""The Python reference models against the Rust ones, without a server: the
calls of the shared corpus (crates/ratelimit-core/src/reference/corpus.txt,
format in model_corpus.py) replayed through models.py, and the fixed-window
cases through fwmodels.py too, give the replies written there, which the
Rust models give as well (their test: `reference::agreement` in
crates/ratelimit-core). A change of either side's models fails one of the
two tests."""

import model_corpus


def corpus():
    with open(model_corpus.CORPUS) as f:
        return model_corpus.parse(f.read())


def differences(cases, replay):
    """(calls compared, the differing ones described)."""
    n, wrong = 0, []
    for kind, limits, calls in cases:
        got = replay(kind, limits, [(t, op, args) for t, op, args, _ in calls])
        for (t, op, args, want), g in zip(calls, got):
            n += 1
            if g != want:
                spec = " ".join(f"{s}*{w}" for s, w in limits)
                wrong.append(f"case {kind} {spec}: call {t} {op} {args}\n  corpus: {want}\n  Python: {g}")
    return n, wrong


def test_the_corpus_covers_every_kind_and_option():
    cases = corpus()
    kinds = [limits[0][0].split(":")[0] if kind == "single" else "multi" for kind, limits, _ in cases]
    assert {k: kinds.count(k) for k in set(kinds)} == {"tb": 60, "sl": 60, "sc": 60, "fw": 60, "cc": 60, "multi": 180}
    assert sum(1 for kind, limits, _ in cases if kind == "multi" and any(s.startswith("cc:") for s, _ in limits)) == 60
    calls = [c for _, _, cs in cases for c in cs]
    takes = [args for _, op, args, _ in calls if op == "take"]
    for op in ("acquire", "release", "renew"):  # RL.CONCURRENCY
        assert sum(1 for _, o, _, _ in calls if o == op) >= 100, op
    assert len(calls) >= 3000
    assert sum(1 for _, op, _, _ in calls if op == "refund") >= 300
    assert sum(1 for a in takes if a[0] == 0) >= 200  # COST 0
    assert sum(a[1] for a in takes) >= 500 and sum(a[2] for a in takes) >= 300  # PARTIAL, DRYRUN
    assert sum(1 for _, limits, _ in cases if any(int(x) >= 2**40 for s, _ in limits for x in s.split(":")[1:])) >= 40
    back = sum(1 for _, _, cs in cases for a, b in zip(cs, cs[1:]) if b[0] < a[0])
    assert back >= 20, "the clock steps back"
    assert any(r[0][0] == 0 for _, _, cs in cases for _, _, _, r in cs)  # denied
    assert any(r[0][3] == -1 for _, _, cs in cases for _, _, _, r in cs)  # never fits


def test_models_py_gives_the_corpus_replies():
    n, wrong = differences(corpus(), model_corpus.replay)
    assert n >= 3000
    assert not wrong, f"{len(wrong)} of {n} calls differ; the first:\n" + "\n".join(wrong[:5])


def test_fwmodels_py_gives_the_corpus_replies_of_the_fixed_window():
    fixed = [c for c in corpus() if c[0] == "single" and c[1][0][0].startswith("fw:")]
    n, wrong = differences(fixed, lambda kind, limits, calls: model_corpus.replay_fw(limits[0][0], calls))
    assert n >= 300
    assert not wrong, f"{len(wrong)} of {n} calls differ; the first:\n" + "\n".join(wrong[:5])
