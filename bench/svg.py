"""The chart of a benchmark report (docs/bench/TAG.svg), drawn by hand as
SVG: small multiples of requests/s as a multiple of INCR, then the memory
row. `chart(rep)` takes a report.Report.
"""

import math

from measure import ALGS, CLIENTS, REGIMES, ks_label


def chart(rep):
    """Small multiples: rows = (replica?, pipeline), columns = keyspace;
    in each panel, RL and Lua throughput as a multiple of INCR."""
    kss = rep.keyspaces()
    rows = [(ph, P) for ph in rep.phases() for P in rep.cfg["pipelines"]]
    pw, ph_, gap = 330, 190, 20
    left, top = 50, 90
    W = left + len(kss) * (pw + gap) + 10
    mem_top = top + len(rows) * (ph_ + 45) + 10
    H = mem_top + 260
    groups = [(a, rg) for a in ALGS for rg in REGIMES]
    vmax = 1.2
    for ph, P in rows:
        for ks in kss:
            for a, rg in groups:
                for kind in ("RL", "LUA"):
                    r = rep.ratio_incr(rep.cell(ph, ks, P, kind, a.tag, rg))
                    if r:
                        vmax = max(vmax, r)
    vmax = math.ceil(vmax * 1.12 * 5) / 5.0   # room for the value labels
    o = []
    o.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
             'font-family="Helvetica,Arial,sans-serif" font-size="11">' % (W, H, W, H))
    o.append('<rect width="100%" height="100%" fill="#ffffff"/>')
    o.append('<text x="%d" y="24" font-size="16" font-weight="bold">Requests/s as a multiple of INCR '
             '(same run, same settings)</text>' % left)
    o.append('<text x="%d" y="44" fill="#444">redis-benchmark -c %d; bars: RL command (dark) and its '
             'Lua twin (light) in three regimes: g = mostly granted, d = mostly denied, m = mix. '
             '%s, %s</text>' % (left, CLIENTS, rep.d["machine"]["cpu"], rep.d["machine"]["date"]))
    colors = {"tb": ("#1f5fa8", "#9cc0ea"), "sc": ("#2e8b57", "#a6dcb9"), "sl": ("#b8562b", "#f0bfa4")}
    lx = left
    for a in ALGS:
        o.append('<rect x="%d" y="56" width="12" height="12" fill="%s"/>' % (lx, colors[a.tag][0]))
        o.append('<rect x="%d" y="56" width="12" height="12" fill="%s"/>' % (lx + 14, colors[a.tag][1]))
        o.append('<text x="%d" y="66">%s / Lua twin</text>' % (lx + 30, a.cmd))
        lx += 215
    o.append('<line x1="%d" y1="62" x2="%d" y2="62" stroke="#000" stroke-dasharray="4,3"/>' % (lx, lx + 20))
    o.append('<text x="%d" y="66">INCR = 1</text>' % (lx + 24))
    o.append('<line x1="%d" y1="62" x2="%d" y2="62" stroke="#c00" stroke-dasharray="2,2"/>' % (lx + 90, lx + 110))
    o.append('<text x="%d" y="66">target 0.7 (0.6 log, replica)</text>' % (lx + 114))
    for ri, (ph, P) in enumerate(rows):
        y0 = top + ri * (ph_ + 45)
        for ci, ks in enumerate(kss):
            x0 = left + ci * (pw + gap)
            title = "%s, pipeline %d%s" % (ks_label(ks), P, ", 1 replica" if ph == "replica" else "")
            o.append('<text x="%d" y="%d" font-weight="bold">%s</text>' % (x0, y0 + 12, title))
            py0, py1 = y0 + 20, y0 + 20 + ph_ - 30
            o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>'
                     % (x0, py0, pw, py1 - py0))

            def yv(v):
                return py1 - (py1 - py0) * min(v, vmax) / vmax
            step = 0.5 if vmax <= 3 else 1.0
            t = 0.0
            while t <= vmax + 1e-9:
                o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e4e4e4"/>' % (x0, yv(t), x0 + pw, yv(t)))
                if ci == 0:
                    o.append('<text x="%d" y="%.1f" text-anchor="end" fill="#555">%.1f</text>' % (x0 - 4, yv(t) + 4, t))
                t += step
            o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#000" stroke-dasharray="4,3"/>' % (x0, yv(1), x0 + pw, yv(1)))  # noqa: E501 (one SVG element per line)
            gw = pw / float(len(groups))
            for gi, (a, rg) in enumerate(groups):
                gx = x0 + gi * gw
                thr = 0.6 if (a.tag == "sl" or ph == "replica") else 0.7
                o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="2,2"/>'
                         % (gx + 2, yv(thr), gx + gw - 2, yv(thr)))
                for bi, kind in enumerate(("RL", "LUA")):
                    r = rep.ratio_incr(rep.cell(ph, ks, P, kind, a.tag, rg))
                    if r is None:
                        continue
                    bw = (gw - 8) / 2.0
                    bx = gx + 4 + bi * bw
                    o.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s %s: %.2f× INCR</title></rect>'  # noqa: E501 (one SVG element per line)
                             % (bx, yv(r), bw - 1, py1 - yv(r), colors[a.tag][bi],
                                a.cmd if kind == "RL" else "Lua " + a.lua, rg, title, r))
                    if kind == "RL":
                        o.append('<text x="%.1f" y="%.1f" font-size="8" text-anchor="middle">%.2f</text>'
                                 % (bx + bw / 2.0, yv(r) - 2, r))
                o.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#333">%s</text>'
                         % (gx + gw / 2.0, py1 + 12, rg[0]))
    memory(rep, o, left, mem_top, W - left - 10)
    o.append('</svg>')
    return "\n".join(o) + "\n"

def memory(rep, o, x, y, width):
    """Bottom row: bytes per key, and sliding-log bytes per grant."""
    mem = rep.d["memory"]
    half = (width - 40) / 2.0
    o.append('<text x="%d" y="%d" font-weight="bold">Memory: bytes per key (used_memory growth over %s keys, one grant each)</text>'  # noqa: E501 (one SVG element per line)
             % (x, y + 12, "{:,}".format(rep.cfg["mem_keys"])))
    bars = [(m["label"], m["bytes_per_key"], "#777" if m["alg"] is None else
             ("#1f5fa8", "#2e8b57", "#b8562b")[["tb", "sc", "sl"].index(m["alg"])] if m["kind"] == "rl" else
             ("#9cc0ea", "#a6dcb9", "#f0bfa4")[["tb", "sc", "sl"].index(m["alg"])]) for m in mem]
    hbars(o, x, y + 22, half, bars, "B")
    x2 = x + half + 40
    o.append('<text x="%d" y="%d" font-weight="bold">Sliding log: bytes per grant (key bytes / grants; distinct grant times)</text>'  # noqa: E501 (one SVG element per line)
             % (x2, y + 12))
    lb = []
    for m in rep.d["log_memory"]:
        lb.append(("%s, %d grants/key" % ("RL.SLIDINGLOG" if m["twin"] == "module" else "Lua sorted set", m["grants"]),
                   m["bytes_per_key"] / float(m["grants"]), "#b8562b" if m["twin"] == "module" else "#f0bfa4"))
    hbars(o, x2, y + 22, half, lb, "B/grant", mark=8.0)

def hbars(o, x, y, width, bars, unit, mark=None):
    if not bars:
        return
    label_w = 170
    bh = 200.0 / max(len(bars), 1)
    vmax = max(v for _, v, _ in bars) * 1.15
    if mark:
        vmax = max(vmax, mark * 1.15)
    span = width - label_w - 90   # room for the value label
    for i, (label, v, color) in enumerate(bars):
        by = y + i * bh
        o.append('<text x="%.1f" y="%.1f" text-anchor="end" fill="#333">%s</text>' % (x + label_w - 6, by + bh * 0.65, label))
        wv = span * v / vmax
        o.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (x + label_w, by + 2, wv, bh - 4, color))
        o.append('<text x="%.1f" y="%.1f" fill="#000">%.1f %s</text>' % (x + label_w + wv + 4, by + bh * 0.65, v, unit))
    if mark:
        mx = x + label_w + span * mark / vmax
        o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="2,2"/>' % (mx, y, mx, y + bh * len(bars)))  # noqa: E501 (one SVG element per line)
        o.append('<text x="%.1f" y="%.1f" fill="#c00" font-size="9">target %g</text>' % (mx + 3, y + bh * len(bars) + 10, mark))  # noqa: E501 (one SVG element per line)
