"""Reporting: a run's results (bench/results-TAG.json) as the full report
docs/bench/TAG.md and its chart (svg.py), and BENCHMARKS.md, one summary
table per server from every bench/results-*.json. The prose of each is a
Markdown template in bench/templates/ that `fill` completes: `${name}`
inside a line is a value, a line that is only `${name}` is a block of
lines (dropped when the block is empty).
"""

import glob
import json
import math
import os
import re
import statistics

import svg
from measure import ALG_BY_TAG, ALGS, HOUR, REGIMES, BenchError, ks_label, module_prefix, server_version

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
QUICK_BANNER = ["**Quick mode (`--quick`): tiny counts to prove the script works; these numbers mean nothing.**", ""]
_FIELD = re.compile(r"\$\{(\w+)\}")


def fill(template, **values):
    """The lines of `template` with its fields filled in from `values`
    (str for a field inside a line, a list of lines for a block line)."""
    with open(os.path.join(TEMPLATES, template)) as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = []
    for line in lines:
        m = _FIELD.fullmatch(line)
        if m and isinstance(values[m.group(1)], list):
            out.extend(values[m.group(1)])
            continue
        out.append(_FIELD.sub(lambda m: str(values[m.group(1)]), line))
    return out


def server_title(mc):
    """'Redis 7.0.15 (malloc=jemalloc-5.3.0)' from a run's `--version` line."""
    return "%s (malloc=%s)" % server_version(mc.get("redis_server", ""))


TARGETS = [
    # id, text, threshold
    ("tb_incr", "RL.TOKENBUCKET ≥ 0.7× INCR", 0.7),
    ("sc_incr", "RL.SLIDINGCOUNTER ≥ 0.7× INCR", 0.7),
    ("sl_incr", "RL.SLIDINGLOG (limit 100, 60 s window) ≥ 0.6× INCR", 0.6),
    ("lua", "every RL command ≥ 7× its Lua twin with pipelining (P16)", 7.0),
    ("lua_ceiling", "↳ supporting figure, not the target: INCR ÷ Lua twin at P16 "
     "(the highest ratio any command could show here)", 7.0),
    ("lua_server", "↳ supporting figure, not the target: server µs per call, Lua twin ÷ RL command, "
     "P16 runs", 7.0),
    ("replica", "with a replica attached, every RL command ≥ 0.6× INCR", 0.6),
    ("mem_tb", "token bucket key ≤ 1.5× an INCR counter key with a TTL", 1.5),
    ("mem_sc", "sliding counter key ≤ 1.5× an INCR counter key with a TTL", 1.5),
    ("mem_sl", "sliding log ≤ 8 bytes per grant", 8.0),
]



class Report:
    def __init__(self, data):
        self.d = data
        # A run of --only-multi has its composition cells only.
        self.res = data.get("results", [])
        self.by_id = {r["id"]: r for r in self.res}
        self.cfg = data.get("config", {})
        self.missing = []

    def cell(self, phase, ks, P, kind, alg=None, regime=None):
        for r in self.res:
            if (r["phase"], r["ks"], r["P"], r["kind"], r["alg"], r["regime"]) == (phase, ks, P, kind, alg, regime):
                return r
        self.missing.append("%s %s P%d %s %s %s" % (phase, ks, P, kind, alg, regime))
        return None

    def phases(self):
        return [p for p in ("primary", "replica") if any(r["phase"] == p for r in self.res)]

    def incr_of(self, r):
        """Geometric mean of the INCR runs made just before and just after."""
        refs = [self.by_id.get(i) for i in (r or {}).get("incr_ref") or []]
        if len(refs) != 2 or not all(x and x["rps"] for x in refs):
            return None
        return math.sqrt(refs[0]["rps"] * refs[1]["rps"])

    def ratio_incr(self, r):
        ref = self.incr_of(r)
        if not r or not ref:
            return None
        return r["rps"] / ref

    def ratio_lua(self, phase, ks, P, alg, regime):
        m = self.cell(phase, ks, P, "RL", alg, regime)
        lua = self.cell(phase, ks, P, "LUA", alg, regime)
        if not m or not lua or not lua["rps"]:
            return None
        return m["rps"] / lua["rps"]

    def keyspaces(self):
        return [k for k, _ in self.cfg["keyspaces"]]

    # -- targets ---------------------------------------------------------
    def targets(self):
        out = []
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]

        def worst(values, thr, what):
            vals = [(v, w) for v, w in values if v is not None]
            if len(vals) != len(values) or not vals:
                self.missing.append("target figures for " + what)
                return None
            v, w = min(vals)
            bad = sum(1 for x, _ in vals if x < thr)
            med = statistics.median(x for x, _ in vals)
            return v, w, bad, len(vals), med

        for alg in ALGS:
            tid = alg.tag + "_incr"
            vals = [(self.ratio_incr(self.cell("primary", ks, P, "RL", alg.tag, rg)),
                     "%s, %s, P%d" % (rg, ks_label(ks), P)) for ks, P in cols for rg in REGIMES]
            out.append((tid, worst(vals, dict((t[0], t[2]) for t in TARGETS)[tid], tid)))
        vals = [(self.ratio_lua("primary", ks, 16, alg.tag, rg), "%s %s, %s" % (alg.cmd, rg, ks_label(ks)))
                for alg in ALGS for ks in self.keyspaces() for rg in REGIMES]
        out.append(("lua", worst(vals, 7.0, "lua")))
        # What limits that ratio here: INCR itself vs the twin, and server time.
        ceil_vals, srv_vals = [], []
        for alg in ALGS:
            for ks in self.keyspaces():
                for rg in REGIMES:
                    m = self.cell("primary", ks, 16, "RL", alg.tag, rg)
                    lua = self.cell("primary", ks, 16, "LUA", alg.tag, rg)
                    inc = self.incr_of(lua)
                    where = "%s %s, %s" % (alg.cmd, rg, ks_label(ks))
                    ceil_vals.append((inc / lua["rps"] if inc and lua and lua["rps"] else None, where))
                    srv_vals.append((lua["usec_per_call"] / m["usec_per_call"]
                                     if m and lua and m["usec_per_call"] else None, where))
        out.append(("lua_ceiling", worst(ceil_vals, 7.0, "lua ceiling")))
        out.append(("lua_server", worst(srv_vals, 7.0, "lua server time")))
        if "replica" in self.phases():
            vals = [(self.ratio_incr(self.cell("replica", ks, P, "RL", alg.tag, rg)),
                     "%s %s, %s, P%d" % (alg.cmd, rg, ks_label(ks), P))
                    for alg in ALGS for ks, P in cols for rg in REGIMES]
            out.append(("replica", worst(vals, 0.6, "replica")))
        else:
            self.missing.append("replica phase")
        mem = {m["label"]: m for m in self.d["memory"]}
        base = mem.get("INCR + PEXPIRE")
        for alg, tid in ((ALGS[0], "mem_tb"), (ALGS[1], "mem_sc")):
            m = mem.get(alg.cmd)
            if not base or not m:
                self.missing.append("memory " + alg.cmd)
                out.append((tid, None))
                continue
            r1 = m["bytes_per_key"] / base["bytes_per_key"]
            r2 = m["memory_usage"] / base["memory_usage"]
            # Judged on used_memory, what a key really costs. MEMORY USAGE is
            # shown beside it: the module's is that real cost, while an INCR
            # counter's leaves out what Redis does not count for strings.
            out.append((tid, (r1, "used_memory %.2f×; MEMORY USAGE %.2f×" % (r1, r2), int(r1 > 1.5), 1, None)))
        per = [(self.log_marginal(g), "%d grants/key" % g) for g, _ in self.cfg["log_grants"]]
        vals = []
        for v, w in per:
            if v:
                vals.append((v["marg_um"], w + ", used_memory"))
                vals.append((v["marg_mu"], w + ", MEMORY USAGE"))
        if not all(v for v, _ in per):
            self.missing.append("sliding log bytes per grant")
            out.append(("mem_sl", None))
        else:
            v, w = max(vals)
            out.append(("mem_sl", (v, w, sum(1 for x, _ in vals if x > 8.0), len(vals), None)))
        return out

    def log_one(self, twin):
        """(used_memory, MEMORY USAGE) bytes of a key holding one grant."""
        label = "RL.SLIDINGLOG" if twin == "module" else "Lua slidinglog.lua"
        for m in self.d["memory"]:
            if m["label"] == label:
                return m["bytes_per_key"], m["memory_usage"]
        return None

    def log_marginal(self, grants, twin="module"):
        """Bytes per grant at `grants` grants per key: marginal over a key
        with one grant, and total / grants, by used_memory and MEMORY USAGE."""
        one = self.log_one(twin)
        for m in self.d["log_memory"]:
            if m["twin"] == twin and m["grants"] == grants and one is not None:
                return dict(
                    marg_um=(m["bytes_per_key"] - one[0]) / float(grants - 1),
                    marg_mu=(m["memory_usage"] - one[1]) / float(grants - 1),
                    total_um=m["bytes_per_key"] / float(grants),
                    total_mu=m["memory_usage"] / float(grants))
        return None

    # -- markdown --------------------------------------------------------
    def composition_ratios(self):
        """Per round: server time of a 2-limit RL.MULTI ÷ a single call and
        ÷ a 1-limit RL.MULTI, and requests/s of a 2-limit call ÷ two
        pipelined single calls."""
        rows = self.d.get("composition") or []
        out = []
        for rnd in sorted({r["round"] for r in rows}):
            c = {r["cell"]: r for r in rows if r["round"] == rnd}
            if not all(k in c for k in ("single", "multi1", "multi2", "multi2_mixed", "pair")):
                continue
            out.append(dict(
                round=rnd,
                usec_multi2_vs_single=c["multi2"]["usec_per_request"] / c["single"]["usec_per_request"],
                usec_multi2_vs_multi1=c["multi2"]["usec_per_request"] / c["multi1"]["usec_per_request"],
                usec_mixed_vs_single=c["multi2_mixed"]["usec_per_request"] / c["single"]["usec_per_request"],
                usec_multi2_vs_two_calls=c["multi2"]["usec_per_request"] / c["pair"]["usec_per_request"],
                rps_multi2_vs_pair=c["multi2"]["requests_per_s"] / c["pair"]["requests_per_s"],
            ))
        return out


    def first_incr(self, phase, ks, P):
        for r in self.res:
            if (r["phase"], r["ks"], r["P"], r["kind"]) == (phase, ks, P, "INCR"):
                return r
        self.missing.append("INCR %s %s P%d" % (phase, ks, P))
        return None

    @staticmethod
    def fmt_rps(r):
        return "–" if not r else "{:,.0f}".format(r["rps"])

    # -- the full report --------------------------------------------------
    def markdown(self):
        d = self.d
        mc = d["machine"]
        cfg = self.cfg
        lines = fill(
            "report.md",
            server_title=server_title(mc), date=mc["date"], tag=d.get("server_tag", "redis7.0"),
            quick_banner=QUICK_BANNER if d.get("quick") else [],
            nproc=mc["nproc"], cpu=mc["cpu"], memory=mc["memory"], kernel=mc["kernel"],
            redis_server=mc["redis_server"], redis_benchmark=mc["redis_benchmark"], module=mc["module"],
            module_built=mc.get("module_built", "?"), commit=mc["commit"], loadavg=" ".join(mc["loadavg"]),
            run_time="%.0f" % d["elapsed_s"],
            targets_rows=self.targets_rows(), n_keyspaces=len(self.keyspaces()),
            pipelines=" and ".join(str(p) for p in cfg["pipelines"]), mem_keys="{:,}".format(cfg["mem_keys"]),
            ratio_tables=self.ratio_tables(), usec_table=self.usec_table(),
            memory_table=self.memory_table(), log_memory_table=self.log_memory_table(),
            composition=self.composition(), envoy=self.envoy(),
            server_cmdline=d.get("server_cmdline", "?"), seconds="%.1f" % cfg["seconds"], nmin=cfg["nmin"],
            nmax="{:,}".format(cfg["nmax"]), regimes_rows=self.regimes_rows(),
            all_runs=self.all_runs(), n_runs=len(self.res), command_lines=[r.get("cmdline", "?") for r in self.res])
        return "\n".join(lines) + "\n"

    def targets_rows(self):
        out = []
        texts = dict((t[0], t[1]) for t in TARGETS)
        for tid, v in self.targets():
            if v is None:
                out.append("| %s | figure missing | **missing** |" % texts[tid])
                continue
            val, where, bad, total, med = v
            if tid.startswith("mem_sl"):
                res = "worst %.2f B per grant (%s, marginal)" % (val, where)
            elif tid.startswith("mem_"):
                res = "%.2f× (%s)" % (val, where)
            else:
                res = "worst %.2f× (%s); median %.2f× over %d cells" % (val, where, med, total)
            status = "met" if bad == 0 else "**missed** (%d of %d)" % (bad, total)
            if tid in ("lua_ceiling", "lua_server"):
                status = "(≥ 7 in %d of %d)" % (total - bad, total)
            out.append("| %s | %s | %s |" % (texts[tid], res, status))
        return out

    def ratio_tables(self):
        out = []
        w = out.append
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]
        head = "| command | regime | " + " | ".join("%s P%d" % (ks, P) for ks, P in cols) + " |"
        sep = "|---|---|" + "---:|" * len(cols)
        for phase, title in (("primary", "RL command ÷ INCR (no replica)"),
                             ("lua", "RL command ÷ its Lua twin (no replica)"),
                             ("replica", "RL command ÷ INCR, one replica attached"),
                             ("replica-lua", "RL command ÷ its Lua twin, one replica attached")):
            ph = "replica" if phase.startswith("replica") else "primary"
            if ph not in self.phases():
                continue
            w("## " + title)
            w("")
            w(head)
            w(sep)
            for alg in ALGS:
                for rg in REGIMES:
                    vals = []
                    for ks, P in cols:
                        if phase.endswith("lua"):
                            v = self.ratio_lua(ph, ks, P, alg.tag, rg)
                        else:
                            v = self.ratio_incr(self.cell(ph, ks, P, "RL", alg.tag, rg))
                        vals.append("–" if v is None else "%.2f" % v)
                    w("| %s | %s | %s |" % (alg.cmd, rg, " | ".join(vals)))
            w("")
            if phase == "primary":
                # the INCR and PING baselines themselves
                w("Baselines (requests/s): " + "; ".join(
                    "%s P%d: PING %s, INCR %s" % (
                        ks, P, self.fmt_rps(self.cell(ph, ks, P, "PING")),
                        self.fmt_rps(self.first_incr(ph, ks, P)))
                    for ks, P in cols) + ".")
                w("")
        return out

    def composition(self):
        """The RL.MULTI section (no lines when the run has no such cells)."""
        rows = self.d.get("composition")
        if not rows:
            return []
        cells = ["| %d | %s | %s | %.2f |" % (r["round"], r["cell"], "{:,.0f}".format(r["requests_per_s"]),
                                              r["usec_per_request"]) for r in rows]
        ratios = ["| %d | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
            q["round"], q["usec_multi2_vs_single"], q["usec_multi2_vs_multi1"], q["usec_mixed_vs_single"],
            q["usec_multi2_vs_two_calls"], q["rps_multi2_vs_pair"]) for q in self.composition_ratios()]
        return fill("composition.md", cell_rows=cells, ratio_rows=ratios)

    def envoy_ratios(self):
        """Per round: RL.FIXEDWINDOW's server µs per decision, the INCRBY +
        EXPIRE pipeline's (the sum of the two commands'), and their ratio."""
        rows = self.d.get("envoy") or []
        out = []
        for rnd in sorted({r["round"] for r in rows}):
            c = {r["cell"]: r for r in rows if r["round"] == rnd}
            if not all(k in c for k in ("fixedwindow", "incrby", "expire")):
                continue
            pipeline = c["incrby"]["usec_per_call"] + c["expire"]["usec_per_call"]
            out.append(dict(round=rnd, module=c["fixedwindow"]["usec_per_call"], pipeline=pipeline,
                            ratio=c["fixedwindow"]["usec_per_call"] / pipeline))
        return out

    def envoy(self):
        """The RL.FIXEDWINDOW vs INCRBY + EXPIRE section (no lines when the
        run has no such cells)."""
        rows = self.d.get("envoy")
        if not rows:
            return []
        cells = ["| %d | %s | %s | %.2f |" % (r["round"], r["cell"], "{:,.0f}".format(r["requests_per_s"]),
                                              r["usec_per_call"]) for r in rows]
        ratios = ["| %d | %.2f | %.2f | %.2f |" % (q["round"], q["module"], q["pipeline"], q["ratio"])
                  for q in self.envoy_ratios()]
        return fill("envoy.md", cell_rows=cells, ratio_rows=ratios)

    def usec_table(self):
        out = []
        w = out.append
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]
        w("| command | regime | " + " | ".join("%s P%d" % (ks, P) for ks, P in cols) + " |")
        w("|---|---|" + "---:|" * len(cols))
        incr = []
        for ks, P in cols:
            xs = [r["usec_per_call"] for r in self.res
                  if (r["phase"], r["ks"], r["P"], r["kind"]) == ("primary", ks, P, "INCR")]
            incr.append("%.2f" % statistics.mean(xs) if xs else "–")
        w("| INCR | | " + " | ".join(incr) + " |")
        for kind in ("RL", "LUA"):
            for alg in ALGS:
                for rg in REGIMES:
                    vals = []
                    for ks, P in cols:
                        r = self.cell("primary", ks, P, kind, alg.tag, rg)
                        vals.append("–" if r is None else "%.2f" % r["usec_per_call"])
                    w("| %s | %s | %s |" % (alg.cmd if kind == "RL" else "Lua " + alg.lua, rg, " | ".join(vals)))
        return out

    def memory_table(self):
        out = ["| kind | arguments | bytes/key (used_memory) | × INCR+TTL | bytes/key (MEMORY USAGE) | × INCR+TTL |",
               "|---|---|---:|---:|---:|---:|"]
        mem = self.d["memory"]
        base = next((m for m in mem if m["label"] == "INCR + PEXPIRE"), None)
        for m in mem:
            args = "`%s`" % " ".join(str(a) for a in m["args"]) if m["args"] else {
                "incr_ttl": "`INCR k` + `PEXPIRE k %d` (the target's baseline)" % HOUR,
                "incrby_ttl": "`INCRBY k 10000` + `PEXPIRE k %d` (a counter ≥ 10,000: not a shared integer)" % HOUR,
                "incr": "`INCR k`"}[m["kind"]]
            r1 = m["bytes_per_key"] / base["bytes_per_key"] if base else float("nan")
            r2 = m["memory_usage"] / base["memory_usage"] if base else float("nan")
            out.append("| %s | %s | %.1f | %.2f | %.1f | %.2f |" % (m["label"], args, m["bytes_per_key"], r1,
                                                                   m["memory_usage"], r2))
        return out

    def log_memory_table(self):
        out = ["| grants/key | keys | | bytes/key | marginal B/grant | total B/grant | distinct entries |",
               "|---:|---:|---|---:|---:|---:|---:|"]
        lm = self.d["log_memory"]
        for g, nkeys in self.cfg["log_grants"]:
            for twin, name in (("module", "RL.SLIDINGLOG"), ("lua", "Lua sorted set")):
                m = next((x for x in lm if x["twin"] == twin and x["grants"] == g), None)
                v = self.log_marginal(g, twin)
                if not (m and v):
                    self.missing.append("log memory %s %d" % (twin, g))
                    continue
                out.append("| %d | %d | %s | %.0f / %.0f | %.2f / %.2f | %.2f / %.2f | %s |"
                           % (g, nkeys, name, m["bytes_per_key"], m["memory_usage"], v["marg_um"], v["marg_mu"],
                              v["total_um"], v["total_mu"],
                              "%.0f" % m["distinct_entries"] if m["distinct_entries"] is not None else "(not visible)"))
        return out

    def regimes_rows(self):
        out = []
        for alg in ALGS:
            for rg in REGIMES:
                key = module_prefix(alg, rg, "<rid>") + "__rand_int__"
                line = "`%s %s %s`" % (alg.cmd, key, " ".join(str(a) for a in alg.regimes[rg]))
                if rg == "granted" and alg.hot_granted:
                    line += "; hot key: `%s`" % " ".join(str(a) for a in alg.hot_granted)
                if rg == "granted":
                    warm = "none (fresh keys)"
                elif rg == "denied":
                    warm = "every key: one call with the same arguments (drains it)"
                else:
                    warm = ("even keys: one call with `COST %d` (drained); odd keys fresh. "
                            "Hot key: `-r 2`, key 0 drained, key 1 deleted before each run"
                            % alg.mix_cost)
                out.append("| %s | %s | %s | %s |" % (alg.cmd, rg, line, warm))
        return out

    def all_runs(self):
        out = []
        w = out.append
        for phase in self.phases():
            for ks in self.keyspaces():
                for P in self.cfg["pipelines"]:
                    w("### %s, %s, pipeline %d" % (
                        "no replica" if phase == "primary" else "one replica attached", ks_label(ks), P))
                    w("")
                    w("| command | regime | n | rps | × INCR | × Lua | µs | p50 | p99 | granted |")
                    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
                    for r in self.res:
                        if (r["phase"], r["ks"], r["P"]) != (phase, ks, P):
                            continue
                        if r["kind"] in ("PING", "INCR"):
                            name = r["kind"]
                        elif r["kind"] == "RL":
                            name = ALG_BY_TAG[r["alg"]].cmd
                        else:
                            name = "Lua " + ALG_BY_TAG[r["alg"]].lua
                        ri = self.ratio_incr(r) if r["kind"] in ("RL", "LUA") else None
                        rl = self.ratio_lua(phase, ks, P, r["alg"], r["regime"]) if r["kind"] == "RL" else None
                        w("| %s | %s | %s | %s | %s | %s | %.2f | %.3f | %.3f | %s |" % (
                            name, r["regime"] or "", "{:,}".format(r["n"]), self.fmt_rps(r),
                            "" if ri is None else "%.2f" % ri, "" if rl is None else "%.2f" % rl,
                            r["usec_per_call"], r["p50_ms"], r["p99_ms"],
                            "" if r["granted"] is None else "%.1f%%" % (100 * r["granted"])))
                    w("")
        return out

    # -- BENCHMARKS.md ------------------------------------------------------
    def summary(self):
        """This run's section of BENCHMARKS.md."""
        d = self.d
        mc = d["machine"]
        name, malloc = server_version(mc["redis_server"])
        ks, P = "10k", 16
        incr = [r["usec_per_call"] for r in self.res
                if (r["phase"], r["ks"], r["P"], r["kind"]) == ("primary", ks, P, "INCR")]
        rows = ["| INCR | | 1.00 | | %s | | 1.00 |" % ("%.2f" % statistics.mean(incr) if incr else "–")]

        def f(v, fmt="%.2f"):
            return "–" if v is None else fmt % v

        for alg in ALGS:
            for rg in REGIMES:
                m = self.cell("primary", ks, P, "RL", alg.tag, rg)
                lua = self.cell("primary", ks, P, "LUA", alg.tag, rg)
                rep_r = self.cell("replica", ks, P, "RL", alg.tag, rg) if "replica" in self.phases() else None
                rows.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    alg.cmd, rg, f(self.ratio_incr(m)), f(self.ratio_lua("primary", ks, P, alg.tag, rg)),
                    f(m and m["usec_per_call"]), f(lua and lua["usec_per_call"]), f(self.ratio_incr(rep_r))))
        mem = {m["label"]: m for m in d["memory"]}
        base = mem.get("INCR + PEXPIRE")
        mrows = []
        for label in ["INCR + PEXPIRE"] + [a.cmd for a in ALGS] + ["Lua " + a.lua for a in ALGS]:
            m = mem.get(label)
            if not m:
                continue
            mrows.append("| %s | %.0f | %.0f | %s |" % (
                label, m["bytes_per_key"], m["memory_usage"],
                "%.2f / %.2f" % (m["bytes_per_key"] / base["bytes_per_key"],
                                 m["memory_usage"] / base["memory_usage"]) if base else "–"))
        g = max(x for x, _ in d["config"]["log_grants"])
        marg = self.log_marginal(g)
        lua = self.log_marginal(g, "lua")
        if marg and lua:
            mrows.append("| sliding log, per grant (%d grants/key, marginal) | %.2f | %.2f | Lua sorted set: %.1f / %.1f |"
                         % (g, marg["marg_um"], marg["marg_mu"], lua["marg_um"], lua["marg_mu"]))
        note = (" (**libc malloc**: this wheel's server is built without jemalloc, so allocation sizes and "
                "`used_memory` differ from a jemalloc build)" if "libc" in malloc else " (jemalloc)")
        rounds = self.envoy_ratios()
        envoy = (["", "RL.FIXEDWINDOW against envoyproxy/ratelimit's `INCRBY` + `EXPIRE` pipeline for one descriptor, "
                  "server µs per decision, each round's three cells back to back: "
                  + "; ".join("%.2f vs %.2f (%.2f×)" % (q["module"], q["pipeline"], q["ratio"]) for q in rounds)
                  + " ([the method](docs/bench/%s.md#rlfixedwindow-against-envoyproxyratelimits-pipeline-no-replica))."
                  % d["server_tag"]] if rounds else [])
        return fill("BENCHMARKS-server.md", name=name, malloc=malloc, quick_banner=QUICK_BANNER if d.get("quick") else [],
                    date=mc["date"], command_rows=rows, malloc_note=note, memory_rows=mrows, tag=d["server_tag"],
                    envoy=envoy)


def write_outputs(data, out):
    """docs/bench/TAG.md and .svg from one run, then BENCHMARKS.md from
    every saved run under `out`."""
    tag = data.get("server_tag", "redis7.0")
    rep = Report(data)
    md = rep.markdown()
    chart = svg.chart(rep)
    os.makedirs(os.path.join(out, "docs", "bench"), exist_ok=True)
    with open(os.path.join(out, "docs", "bench", tag + ".md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "docs", "bench", tag + ".svg"), "w") as f:
        f.write(chart)
    if rep.missing:
        raise BenchError("figures missing from the report: " + "; ".join(sorted(set(rep.missing))))
    write_summary(out)
    return rep


SERVER_ORDER = ["redis7.0", "valkey8.1", "valkey9.1"]


def write_summary(out):
    """BENCHMARKS.md: one summary table per server, from every
    bench/results-*.json under `out`."""
    runs = []
    for path in glob.glob(os.path.join(out, "bench", "results-*.json")):
        with open(path) as f:
            data = json.load(f)
        runs.append(data)
    runs.sort(key=lambda d: (SERVER_ORDER.index(d["server_tag"]) if d["server_tag"] in SERVER_ORDER else 99,
                             d["server_tag"]))
    days = sorted({d["machine"]["date"][:10] for d in runs})
    lines = fill(
        "BENCHMARKS.md",
        runs="; ".join("%s on %s (load average at start %s)" % (
            server_title(d["machine"]), d["machine"]["date"], " ".join(d["machine"]["loadavg"])) for d in runs),
        same_day="All on the same day." if len(days) == 1 else "**Not all on the same day: %s.**" % ", ".join(days),
        nproc=runs[0]["machine"]["nproc"] if runs else "?",
        servers=[line for d in runs for line in Report(d).summary()])
    # The edge bench's section (bench/edge/edge.py writes it) and the Envoy
    # service's (make bench-envoy) stay.
    path = os.path.join(out, "BENCHMARKS.md")
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        for name in ("edge-bench", "bench-envoy", "concurrency"):
            a, b = old.find("<!-- %s:begin -->" % name), old.find("<!-- %s:end -->" % name)
            if 0 <= a < b:
                lines += ["", old[a:b + len("<!-- %s:end -->" % name)]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
