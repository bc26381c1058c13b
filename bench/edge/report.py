"""The edge bench's figures and reports: the per-phase analysis of a run's
records (analyse, series) and what is written from the results (the
BENCHMARKS.md section, the chart docs/edge-TAG.svg / .png). edge.py drives
the runs and calls these; its --render-only rewrites the reports from a
results file without a run.
"""
import glob
import json
import math
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))

MODES = ("lua", "module", "leased")
GATEWAYS = ("node", "python", "rust")
INSTANCES = 2   # the rules' "instances": each gateway's panic limit is half the limit


def capacity_of(r):
    """The tenants' bucket: r per second, bursts of at least 100 (so that a
    lease of 50 is a lease of 50)."""
    return max(100, 10 * r)


# --------------------------------------------------------------- analysis

def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def cpu_between(marks, t0, t1):
    """Redis CPU seconds between two phase boundaries (across a restart: the
    new process's own CPU since it started)."""
    cpu = [(t, v) for t, w, v in marks if w == "cpu" and v is not None]
    a = [v for t, v in cpu if abs(t - t0) < 1e-6]
    b = [v for t, v in cpu if abs(t - t1) < 1e-6]
    if not a or not b:
        return None
    a, b = a[0], b[-1]
    return b[1] - a[1] if a[0] == b[0] else b[1]


def trips_between(marks, t0, t1):
    """The gateway's breaker trips between two phase boundaries (None for a
    run recorded before the bench sampled them)."""
    tr = {t: v for t, w, v in marks if w == "trips" and v is not None}
    a = next((v for t, v in tr.items() if abs(t - t0) < 1e-6), None)
    b = next((v for t, v in tr.items() if abs(t - t1) < 1e-6), None)
    return None if a is None or b is None else b - a


def analyse(run, phases):
    """Per phase: the limited requests' figures, the control requests'
    latency, and the limited ones' latency above the control's."""
    r = run["r"]
    cap = capacity_of(r)
    out = {}
    recs = run["records"]
    for name in dict.fromkeys(p[0] for p in phases):
        if name == "warmup":
            continue
        spans = [(a, b) for n, a, b in phases if n == name]
        sel = [x for x in recs if any(a * 1000 <= x[0] < b * 1000 for a, b in spans)]
        lim = [x for x in sel if x[3] != 2]
        ctl = sorted(x[1] for x in sel if x[3] == 2)
        length = sum(b - a for a, b in spans)
        lat = sorted(x[1] for x in lim)
        cpu = sum(c for c in (cpu_between(run["marks"], a, b) for a, b in spans)
                  if c is not None)
        ab = [x for x in lim if x[3] == 1]
        ab_ok = [x for x in ab if x[2] == 200]
        decided = [x for x in lim if x[4]]
        st = {"n": len(lim), "n_control": len(ctl), "seconds": length,
              "gen_lag_p99": pct(sorted(x[5] for x in sel), 99),
              "rps": sum(1 for x in sel if x[2] > 0) / length if length else 0,
              "s5xx": sum(1 for x in sel if x[2] >= 500),
              "timeouts": sum(1 for x in sel if x[2] == 0),
              "errors": sum(1 for x in sel if x[2] == -1),
              "denied": sum(1 for x in lim if x[2] == 429),
              "panic_share": (sum(1 for x in decided if x[4] == cap // INSTANCES) / len(decided)
                              if decided else 0.0),
              "abuse_sent": len(ab), "abuse_granted": len(ab_ok),
              "abuse_panic": sum(1 for x in ab_ok if x[4] == cap // INSTANCES),
              "redis_cpu_s": cpu,
              "trips": (None if any(trips_between(run["marks"], a, b) is None for a, b in spans)
                        else sum(trips_between(run["marks"], a, b) for a, b in spans)),
              "cpu_ms_per_1k": cpu * 1000 / (len(lim) / 1000) if lim and cpu else 0.0}
        for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9), ("max", 100)):
            st[k] = pct(lat, q)
            st["control_" + k] = pct(ctl, q)
            st["added_" + k] = st[k] - st["control_" + k]
        base = st["control_p50"]
        st["over3"] = sum(1 for v in lat if v - base > 3)
        st["over5"] = sum(1 for v in lat if v - base > 5)
        st["over3_control"] = sum(1 for v in ctl if v - base > 3)
        out[name] = st
    # The abusive tenant over the whole run, against its bucket (cap + r x T),
    # what the panic buckets may add while Redis is away (cap / INSTANCES +
    # r / INSTANCES x T) and the bucket the kill's lost state gives (cap).
    first = next((x[0] for x in recs if x[3] == 1), None)
    if first is not None:
        t_end = recs[-1][0]
        ok = [x for x in recs if x[3] == 1 and x[2] == 200]
        pan = sum(1 for x in ok if x[4] == cap // INSTANCES)
        span = (t_end - first) / 1000
        allowed = cap + r * span
        out["_abuse_total"] = {
            "granted": len(ok), "shared": len(ok) - pan, "panic": pan, "allowed": allowed,
            "shared_beyond": max(0, len(ok) - pan - allowed - cap),
            "panic_allowed": cap // INSTANCES + r / INSTANCES * span,
            "restart_allows": cap, "seconds": span}
    return out


def series(run, bin_s):
    """(t, p99 of the limited requests, p99 of the control ones) per bin of due time."""
    bins = {}
    for due, lat, _, kind, *_ in run["records"]:
        bins.setdefault(int(due / 1000 / bin_s), ([], []))[kind == 2].append(lat)
    return [((k + 0.5) * bin_s, pct(sorted(a), 99), pct(sorted(c), 99))
            for k, (a, c) in sorted(bins.items()) if a and c]


# ---------------------------------------------------------------- reports

COLORS = {"control": "#888888", "lua": "#d62728", "module": "#1f77b4", "leased": "#2ca02c"}
FAULT_PHASES = {"stall": "#f4b400", "fork": "#9c27b0", "outage": "#d62728", "restart": "#555555"}
PHASE_ORDER = ("steady", "stall", "fork", "outage", "restart", "recovery")


def fmt(v, nd=2, sign=False):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"


def table(res):
    """The Markdown tables (one per gateway)."""
    out = []
    for gw in GATEWAYS:
        runs = res["runs"].get(gw)
        if not runs:
            continue
        m = res["meta"]["gateways"][gw]
        cap = (f"capacity {m['capacity']:.0f} req/s (closed loop, Lua mode)" if m["capacity"]
               else "capacity not measured (--rate)")
        out.append(f"**{gw} gateway**: {cap}, offered {m['rate']} req/s (a quarter of the mix on the unlimited "
                   f"control path); abusive tenant {20 * m['r']} req/s against its "
                   f"{m['r']}/s (bucket {capacity_of(m['r'])}).\n")
        out.append("| mode | phase | req/s | generator lag p99 | control p50 / p99 | added p50 | "
                   "p99 | p99.9 | max | >3 ms | >5 ms | 5xx | timeouts | panic | breaker trips | "
                   "abuser granted "
                   "(panic) / rate x t | Redis CPU ms / 1k |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                   "---:|---:|")
        for mode in MODES:
            run = runs.get(mode)
            if not run:
                continue
            for ph in PHASE_ORDER:
                s = run["phases"].get(ph)
                if not s:
                    continue
                lat = [fmt(s["added_" + k], sign=True) for k in ("p50", "p99", "p999", "max")]
                out.append(
                    f"| {mode} | {ph} | {s['rps']:.0f} | {fmt(s['gen_lag_p99'])} | "
                    f"{fmt(s['control_p50'])} / "
                    f"{fmt(s['control_p99'])} | " + " | ".join(lat) +
                    f" | {100 * s['over3'] / s['n']:.1f}% | {100 * s['over5'] / s['n']:.1f}% | "
                    f"{s['s5xx']} | {s['timeouts']} | {100 * s['panic_share']:.0f}% | "
                    f"{fmt(s.get('trips'), 0)} | {s['abuse_granted']} ({s['abuse_panic']}) / {m['r'] * s['seconds']:.0f} | "
                    f"{fmt(s['cpu_ms_per_1k'], 1)} |")
        out.append("\nThe client library's counters over the whole run, warm-up included "
                   "(`rl.metrics()`):\n")
        out.append("| mode | decisions module / lua / local / panic | Redis calls | failures | "
                   "breaker trips (latency / failures) | leases | lease waits | refunds |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for mode in MODES:
            c = metrics_of(runs.get(mode, {}).get("gateway_stats", {}))
            if c:
                out.append(
                    f"| {mode} | {c.get('decisions_module', 0)} / {c.get('decisions_lua', 0)} / "
                    f"{c.get('decisions_local', 0)} / {c.get('decisions_panic', 0)} | "
                    f"{c.get('calls', 0)} | {c.get('failures', 0)} | {c.get('trips', 0)} "
                    f"({c.get('trips_latency', 0)} / {c.get('trips_failures', 0)}) | "
                    f"{c.get('leases', 0)} | {c.get('lease_waits', 0)} | {c.get('refunds', 0)} |")
        out.append("\nThe abusive tenant over the whole run (from its first request):\n")
        for mode in MODES:
            a = runs.get(mode, {}).get("phases", {}).get("_abuse_total")
            if a:
                out.append(f"- {mode}: {a['granted']} granted ({a['panic']} by panic limits) in "
                           f"{a['seconds']:.0f} s; its bucket allows {a['allowed']:.0f} "
                           f"(capacity + rate x time), the panic buckets "
                           f"{a['panic_allowed']:.0f} more, the kill's lost state "
                           f"{a['restart_allows']} more; shared grants beyond bucket and "
                           f"restart: {a['shared_beyond']:.0f}")
        out.append("")
    return "\n".join(out)


def metrics_of(gateway_stats):
    """The library's counters from a gateway's stats page, snake_case (Node's
    are camelCase)."""
    m = gateway_stats.get("limiter") or {}
    return {"".join("_" + ch.lower() if ch.isupper() else ch for ch in k): v
            for k, v in m.items()}


def svg_chart(res):
    """Per gateway: p99 per bin, one line per mode and the control requests'
    (log scale), and the ratio of each mode's p99 to its control's in the same
    bin; fault windows shaded."""
    W, PH, L, R, T = 900, 200, 60, 20, 30
    gws = [g for g in GATEWAYS if g in res["runs"]]
    H = T + len(gws) * (2 * PH + 98) + 10
    total = res["meta"]["total_s"]
    phases = res["meta"]["phases"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{L}" y="18" font-size="13">Edge latency under Redis faults '
             f'({res["meta"]["server"]}, {res["meta"]["date"]}; a shared 2-core machine, '
             f'load average {res["meta"]["loadavg"]})</text>']
    y0 = T
    for gw in gws:
        runs = res["runs"][gw]
        for panel in ("p99", "ratio"):
            top, bot = y0 + 20, y0 + PH
            lo, hi = (0.1, 3000.0) if panel == "p99" else (0.1, 1000.0)

            def X(t):
                return L + (W - L - R) * t / total

            def Y(v, lo=lo, hi=hi, top=top, bot=bot):
                v = min(max(v, lo), hi)
                return bot - (bot - top) * (math.log10(v) - math.log10(lo)) / (
                    math.log10(hi) - math.log10(lo))
            for name, a, b in phases:
                if name in FAULT_PHASES:
                    parts.append(f'<rect x="{X(a):.1f}" y="{top}" width="{X(b) - X(a):.1f}" '
                                 f'height="{bot - top}" fill="{FAULT_PHASES[name]}" '
                                 f'fill-opacity="0.15"/>')
                    if panel == "p99":
                        parts.append(f'<text x="{X(a) + 2:.1f}" y="{top + 10}" font-size="9" '
                                     f'fill="#333">{name}</text>')
            parts.append(f'<rect x="{L}" y="{top}" width="{W - L - R}" height="{bot - top}" '
                         f'fill="none" stroke="#999"/>')
            v = lo
            while v <= hi * 1.0001:
                parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                             f'stroke="#eee"/><text x="{L - 4}" y="{Y(v) + 3:.1f}" '
                             f'text-anchor="end">{v:g}</text>')
                v *= 10
            if panel == "p99":
                for ref, label, dy in ((3, "3 ms", 11), (5, "5 ms", -3)):
                    parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(ref):.1f}" '
                                 f'y2="{Y(ref):.1f}" stroke="#000" stroke-dasharray="4 3"/>'
                                 f'<text x="{W - R - 4}" y="{Y(ref) + dy:.1f}" '
                                 f'text-anchor="end">{label}</text>')
                title = (f"{gw} gateway: p99 latency per 0.5 s, ms (log); grey: the control "
                         f"requests (unlimited path) of each run")
            else:
                parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(1):.1f}" y2="{Y(1):.1f}" '
                             f'stroke="#888"/>')
                title = f"{gw} gateway: p99 / the same run's control p99 in the same 0.5 s (log)"
            parts.append(f'<text x="{L}" y="{top - 5}" font-size="12">{title}</text>')
            if panel == "p99":
                for mode in MODES:
                    if mode in runs:
                        pts = " ".join(f"{X(t):.1f},{Y(c):.1f}" for t, _, c in runs[mode]["series"])
                        parts.append(f'<polyline fill="none" stroke="{COLORS["control"]}" '
                                     f'stroke-width="0.8" stroke-opacity="0.7" points="{pts}"/>')
            for mode in MODES:
                if mode not in runs:
                    continue
                pts = " ".join(
                    f"{X(t):.1f},{Y(p if panel == 'p99' else p / c):.1f}"
                    for t, p, c in runs[mode]["series"] if panel == "p99" or c > 0)
                parts.append(f'<polyline fill="none" stroke="{COLORS[mode]}" stroke-width="1.5" '
                             f'points="{pts}"/>')
            y0 += PH + 25
        step = 5 if total > 20 else 1
        for t in range(0, int(total) + 1, step):
            parts.append(f'<text x="{L + (W - L - R) * t / total:.1f}" y="{y0 - 12}" '
                         f'text-anchor="middle" fill="#666">{t}</text>')
        y0 += 8
        x = L
        for mode in ("control",) + MODES:
            parts.append(f'<line x1="{x}" x2="{x + 20}" y1="{y0}" y2="{y0}" '
                         f'stroke="{COLORS[mode]}" stroke-width="2"/>'
                         f'<text x="{x + 24}" y="{y0 + 4}">{mode}</text>')
            x += 90
        parts.append(f'<text x="{W - R}" y="{y0 + 4}" text-anchor="end" fill="#666">'
                     f'seconds into the run (first {phases[0][2]:g} s: warm-up)</text>')
        y0 += 40
    parts.append("</svg>")
    return "\n".join(parts)


SERVER_ORDER = ("redis7.0", "valkey8.1", "valkey9.1")


def render(res, docs_dir, bench_md):
    """The chart of this run (docs_dir/edge-TAG.svg and .png); with bench_md,
    its section from every bench/edge/results-*.json, else docs_dir/edge-table.md."""
    tag = res["meta"]["server"]
    os.makedirs(docs_dir, exist_ok=True)
    svg_path = os.path.join(docs_dir, f"edge-{tag}.svg")
    with open(svg_path, "w") as f:
        f.write(svg_chart(res))
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-o", svg_path[:-4] + ".png", svg_path], check=True)
    tbl = table(res)
    if bench_md and os.path.exists(bench_md):
        every = []
        for path in glob.glob(os.path.join(HERE, "results-*.json")):
            with open(path) as f:
                every.append(json.load(f))
        every.sort(key=lambda d: (SERVER_ORDER.index(d["meta"]["server"])
                                  if d["meta"]["server"] in SERVER_ORDER else 99))
        replace_section(bench_md, every)
        readme = os.path.join(os.path.dirname(bench_md), "README.md")
        if tag == README_SERVER and os.path.exists(readme):
            replace_readme_line(readme, res)
    else:
        with open(os.path.join(docs_dir, "edge-table.md"), "w") as f:
            f.write(tbl + "\n")
    return tbl


BEGIN, END = "<!-- edge-bench:begin -->", "<!-- edge-bench:end -->"
README_BEGIN, README_END = "<!-- edge-readme:begin -->", "<!-- edge-readme:end -->"
README_SERVER = "redis7.0"   # the server the README's figures are from


def readme_line(res):
    """The README's sentence from this bench: the Node gateway's p99 in the
    stall phase, leased against Lua, with their control requests' p99 (what
    the shared machine cost at the same moments), errors and panic shares."""
    runs = res["runs"]["node"]
    le, lu = runs["leased"]["phases"]["stall"], runs["lua"]["phases"]["stall"]
    errs = [s["s5xx"] + s["timeouts"] + s["errors"] for s in (le, lu)]
    errs = (f"{errs[0]} errors in both" if errs[0] == errs[1]
            else f"{errs[0]} and {errs[1]} errors")
    return (f"At the edge ([HTTP load on the example gateways](docs/edge.md), Redis 7.0, "
            f"{res['meta']['date'][:10]}, on a shared 2-core machine, so absolute figures are "
            f"noisy): under a 15 ms Redis stall every second, the leased Node gateway kept "
            f"p99 at {le['p99']:.1f} ms and the Lua gateway went to {lu['p99']:.1f} ms, "
            f"against {le['control_p99']:.1f} and {lu['control_p99']:.1f} ms for their own "
            f"unlimited requests at the same moments, with {errs}, "
            f"as the 5 ms timeout and the breaker cap every wait; but the Lua gateway "
            f"decided {100 * lu['panic_share']:.0f}% of those requests by its panic limits, "
            f"the leased one {100 * le['panic_share']:.0f}%.")


def replace_readme_line(path, res):
    """README.md: the sentence between its markers (left alone without them)."""
    with open(path) as f:
        s = f.read()
    if README_BEGIN not in s or README_END not in s:
        return
    a = s.index(README_BEGIN) + len(README_BEGIN)
    b = s.index(README_END)
    with open(path, "w") as f:
        f.write(s[:a] + "\n" + wrap(readme_line(res)) + "\n" + s[b:])


def wrap(text, width=76):
    lines, cur = [], ""
    for w in text.split(" "):
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join(lines + [cur])


def replace_section(path, every):
    """BENCHMARKS.md: the edge section between its markers (added at the end
    the first time), one table set per server run."""
    body = [f"{BEGIN}\n## At the edge: HTTP gateways under Redis faults (`make bench-edge`)\n",
            "Generated by `bench/edge/edge.py` from `bench/edge/results-*.json`. One run per "
            "server, on a shared 2-core machine (load average when it ended below; other "
            "engineers' builds and tests were running): absolute figures are noisy, compare "
            "within one run. Latency is end to end from the request's due time (open loop). "
            "Control: the requests on the unlimited path in the same run and phase (absolute "
            "ms); added: a limited request percentile minus the control's; >3 ms / >5 ms: "
            "limited requests more than 3 / 5 ms above the control's median; panic: decisions "
            "by the panic limits. The phases, the chart and what was learned: "
            "[docs/edge.md](docs/edge.md).\n"]
    for res in every:
        m = res["meta"]
        fi = [v for runs in res["runs"].values() for run in runs.values() for t, w, v in run["marks"]
              if w == "fork_info"]
        fork = ", ".join(f"{v['latest_fork_usec'] / 1000:.0f}" for v in fi)
        body.append(f"### {m['server']}: {m['date']}\n\nLoad average {m['loadavg']} at the "
                    f"end, {m['elapsed_s'] / 60:.1f} min; dataset {m['data_gb']:g} GB for the "
                    f"fork (each run's fork: {fork} ms).\n\n{table(res)}")
    body.append(f"{END}\n")
    with open(path) as f:
        s = f.read()
    new = "\n".join(body)
    if BEGIN in s and END in s:
        a = s.index(BEGIN)
        b = s.index(END) + len(END) + 1
        s = s[:a] + new + s[b:]
    else:
        s = s.rstrip("\n") + "\n\n" + new
    with open(path, "w") as f:
        f.write(s)
