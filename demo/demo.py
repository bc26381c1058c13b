#!/usr/bin/env python3
"""Live demo: the four rate-limit algorithms under one traffic profile.

Starts redis-server with the module (or uses --redis), replays one traffic
profile in real time against RL.TOKENBUCKET, RL.SLIDINGLOG,
RL.SLIDINGCOUNTER and RL.FIXEDWINDOW (one key each, the same policy), then
a burst across a window boundary, prints a summary and draws docs/demo.svg.

Policy: "10 requests per second, with room for a burst of 20".
  token bucket     capacity 20, 10 tokens per 1000 ms
  windows          20 per 2000 ms: a window that lets a burst of 20 through
                   must have limit 20, and 20 per 2 s is 10 per second on
                   average, so this is the nearest window equivalent.

Profile (19 s): browsing at 4 req/s for 4 s, a 2 s burst at 40 req/s,
8 s of sustained traffic at 14 req/s, then browsing at 4 req/s for 5 s.
Every request is sent to all four limiters at the same moment (one
pipeline), and every 50 ms a COST 0 call (which changes nothing) reads each
limiter's state: the bucket's tokens, the window's count.

Then the boundary burst (fixed windows' known weakness): fresh keys, 40
requests at 40 req/s, the first 20 in the last half second of a fixed
window and the next 20 in the first half second of the next one. A fixed
window grants all 40 in one second (2 x its limit across the boundary);
the sliding log grants 20, as in any 2 s.

Usage: demo/demo.py [--out docs/demo.svg] [--redis redis://host:port]
"""
import argparse
import os
import subprocess
import shutil
import sys
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CAPACITY = 20          # burst
RATE = 10              # per PERIOD_MS
PERIOD_MS = 1000
WINDOW_LIMIT = CAPACITY
WINDOW_MS = CAPACITY * PERIOD_MS // RATE   # 2000 ms: 20 per 2 s = 10/s

ALGOS = [
    # (label, command, policy arguments, what the state line shows)
    ("Token bucket", "RL.TOKENBUCKET", [CAPACITY, RATE, PERIOD_MS], "tokens"),
    ("Sliding log", "RL.SLIDINGLOG", [WINDOW_LIMIT, WINDOW_MS], "count in window"),
    ("Sliding counter", "RL.SLIDINGCOUNTER", [WINDOW_LIMIT, WINDOW_MS], "estimated count"),
    ("Fixed window", "RL.FIXEDWINDOW", [WINDOW_LIMIT, WINDOW_MS], "count in window"),
]

# (name, start s, end s, requests per second)
PHASES = [
    ("browsing 4/s", 0.0, 4.0, 4),
    ("burst 40/s", 4.0, 6.0, 40),
    ("sustained 14/s", 6.0, 14.0, 14),
    ("browsing 4/s", 14.0, 19.0, 4),
]
BURST = PHASES[1]
SUSTAINED = PHASES[2]
DURATION = PHASES[-1][2]
PROBE_EVERY = 0.05
BIN = 0.1


def schedule():
    """Sorted (t, kind) events: kind 'req' or 'probe'."""
    ev = []
    for _, start, end, rate in PHASES:
        n = round((end - start) * rate)
        # Each request in the middle of its slot: none falls exactly on a
        # phase edge, a window edge, or one window after another request,
        # where a millisecond of scheduling jitter would decide the outcome.
        ev += [(start + (k + 0.5) / rate, "req") for k in range(n)]
    # Probes sit between requests (offset 12.5 ms) so they read the state
    # just after whatever was granted at that tick.
    n = round(DURATION / PROBE_EVERY)
    ev += [(k * PROBE_EVERY + 0.0125, "probe") for k in range(n)]
    ev.sort()
    return ev


def start_server():
    from rltesting.proc import MODULE, Server

    if not os.path.exists(MODULE):
        sys.exit(f"module not built: {MODULE} (run `make build`)")
    return Server()


def aligned_start(r):
    """A monotonic start time at which the server's Unix clock is on a
    multiple of WINDOW_MS, so the sliding counter's and the fixed window's
    windows line up
    with the profile (the burst starts on a window boundary) and the run is
    reproducible."""
    sec, usec = r.time()
    server_ms = sec * 1000 + usec / 1000
    mono_ms = time.monotonic() * 1000
    wait_ms = WINDOW_MS - (server_ms % WINDOW_MS)
    if wait_ms < 300:
        wait_ms += WINDOW_MS
    return (mono_ms + wait_ms) / 1000


# The boundary burst: BOUNDARY_N requests at BOUNDARY_RATE per second,
# centred on a window boundary (half before it, half after).
BOUNDARY_RATE = 40
BOUNDARY_N = 2 * WINDOW_LIMIT


def run_boundary(r, tag, attempts=5):
    """Per algorithm, per request (in order): granted or not. The first
    BOUNDARY_N / 2 requests come before the window boundary, as the fixed
    window's replies show (reset_after_ms: the time left in the window a
    request counted in); a burst in which one landed on the other side (the
    machine stalled the client past its margin of 12.5 ms) is run again on
    fresh keys at the next boundary. Also returns how many requests the
    fixed window counted on each side (BOUNDARY_N / 2 each unless every
    attempt missed), which is what its grants are checked against."""
    keys = [f"demo:{tag}:b:{cmd.split('.')[1].lower()}" for _, cmd, _, _ in ALGOS]
    fixed = [cmd for _, cmd, _, _ in ALGOS].index("RL.FIXEDWINDOW")
    h = BOUNDARY_N // 2
    for attempt in range(attempts):
        r.delete(*keys)
        # the boundary: the next multiple of WINDOW_MS at least 1 s away
        t_b = aligned_start(r) + WINDOW_MS / 1000
        half = BOUNDARY_N / 2 / BOUNDARY_RATE
        times = [-half + (k + 0.5) / BOUNDARY_RATE for k in range(BOUNDARY_N)]
        out = [[] for _ in ALGOS]
        reset_after = []
        pipe = r.pipeline(transaction=False)
        for t in times:
            delay = t_b + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for key, (_, cmd, args, _) in zip(keys, ALGOS):
                pipe.execute_command(cmd, key, *args)
            replies = pipe.execute()
            for i, reply in enumerate(replies):
                out[i].append(reply[0] == 1)
            reset_after.append(replies[fixed][4])
        r.delete(*keys)
        side = WINDOW_MS // 2
        sides = (sum(x <= side for x in reset_after), sum(x > side for x in reset_after))
        if all(x <= side for x in reset_after[:h]) and all(x > side for x in reset_after[h:]):
            break
        then = "again on fresh keys" if attempt + 1 < attempts else f"the last of {attempts} attempts is shown"
        print(f"boundary burst {attempt + 1}: a request landed on the other side of the boundary "
              f"(the machine stalled); {then}", file=sys.stderr, flush=True)
    return out, sides


def halves(grants):
    """(granted before the boundary, granted after it)."""
    h = BOUNDARY_N // 2
    return sum(grants[:h]), sum(grants[h:])


def run(r, tag):
    keys = [f"demo:{tag}:{cmd.split('.')[1].lower()}" for _, cmd, _, _ in ALGOS]
    r.delete(*keys)
    events = schedule()
    # results[i] = list of (t, granted, remaining); probes[i] = list of (t, remaining)
    results = [[] for _ in ALGOS]
    probes = [[] for _ in ALGOS]
    t0 = aligned_start(r)
    late = 0
    pipe = r.pipeline(transaction=False)
    for t, kind in events:
        delay = t0 + t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.05:
            late += 1
        cost = [] if kind == "req" else ["COST", 0]
        for key, (_, cmd, args, _) in zip(keys, ALGOS):
            pipe.execute_command(cmd, key, *args, *cost)
        replies = pipe.execute()
        for i, reply in enumerate(replies):
            allowed, remaining = reply[0], reply[2]
            if kind == "req":
                results[i].append((t, allowed == 1, remaining))
            else:
                probes[i].append((t, remaining))
    r.delete(*keys)
    return results, probes, late


def summarize(results, probes):
    """Per algorithm: the numbers the summary table and the chart show."""
    out = []
    b_start = BURST[1]
    s_start, s_end = SUSTAINED[1], SUSTAINED[2]
    for i, (label, _, args, state) in enumerate(ALGOS):
        res = results[i]
        limit = args[0]
        burst_1s = sum(1 for t, g, _ in res if b_start <= t < b_start + 1 and g)
        burst_1s_total = sum(1 for t, _, _ in res if b_start <= t < b_start + 1)
        first_burst_denial = next((t for t, g, _ in res if t >= b_start and not g), None)
        first_sust_denial = next((t for t, g, _ in res if t >= s_start and not g), None)
        sust_granted = sum(1 for t, g, _ in res if s_start <= t < s_end and g)
        # Recovery: the limiter's headroom while browsing before the burst
        # (lowest remaining seen by the probes over the 2 s before it) is the
        # baseline; recovered = first probe after the overload at or above it.
        base = [rem for t, rem in probes[i] if b_start - 2.0 <= t < b_start]
        baseline = min(base) if base else limit
        rec = next((t for t, rem in probes[i] if t >= s_end and rem >= baseline), None)
        denied_after = [t for t, g, _ in res if t >= s_end and not g]
        out.append({
            "label": label,
            "burst_first_second": burst_1s,
            "burst_first_second_total": burst_1s_total,
            "burst_absorbed_s": None if first_burst_denial is None else first_burst_denial - b_start,
            "throttled_after_s": None if first_sust_denial is None else first_sust_denial - s_start,
            "sustained_rate": sust_granted / (s_end - s_start),
            "recovered_after_s": None if rec is None else rec - s_end,
            "baseline_remaining": baseline,
            "denied_after_overload": len(denied_after),
        })
    return out


def fmt_s(v):
    return "never" if v is None else f"{v:.2f} s"


def print_summary(summary, late):
    print()
    print(f"policy: 10/s with bursts of 20 — token bucket capacity {CAPACITY}, "
          f"{RATE} per {PERIOD_MS} ms; windows {WINDOW_LIMIT} per {WINDOW_MS} ms")
    print("profile: " + ", ".join(f"{n} {a:g}–{b:g} s" for n, a, b, _ in PHASES))
    print()
    head = ("", "burst: granted", "burst absorbed", "14/s throttled", "14/s granted",
            "recovered")
    head2 = ("", "in first second", "until 1st denial", "after", "rate", "after overload")
    w = (17, 16, 17, 15, 13, 15)
    line = lambda cols: "".join(str(c).ljust(x) for c, x in zip(cols, w)).rstrip()  # noqa: E731
    print(line(head))
    print(line(head2))
    for s in summary:
        print(line((
            s["label"],
            f"{s['burst_first_second']} of {s['burst_first_second_total']}",
            fmt_s(s["burst_absorbed_s"]),
            fmt_s(s["throttled_after_s"]),
            f"{s['sustained_rate']:.1f}/s",
            fmt_s(s["recovered_after_s"]),
        )))
    print()
    print("throttled after: from the start of the 14/s phase to its first denial.")
    print("recovered after: from the end of the 14/s phase until the limiter has the")
    print("headroom it had while browsing before the burst (COST 0 probes every 50 ms).")
    if late:
        print(f"note: {late} events ran more than 50 ms late (busy machine); "
              "the numbers use scheduled times.")


def print_boundary(boundary, sides):
    half = BOUNDARY_N // 2
    print()
    print(f"boundary burst: {BOUNDARY_N} requests at {BOUNDARY_RATE}/s on fresh keys, {half} in the "
          f"last {half / BOUNDARY_RATE:g} s of a {WINDOW_MS} ms window, {half} in the first of the next")
    for (label, _, _, _), grants in zip(ALGOS, boundary):
        before, after = halves(grants)
        print(f"  {label:<17}{before + after:>3} granted ({before} before the boundary, {after} after)")
    print(f"  (the fixed window counted {sides[0]} requests before the boundary, {sides[1]} after)")


# ---------------------------------------------------------------- chart (SVG)

def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_chart(results, probes, summary, boundary):
    W = 1000
    left, right = 60, 60
    plot_w = W - left - right
    top = 84
    panel_h = 190
    gap = 46
    bars_max = 4          # requests per 100 ms at 40 req/s
    state_max = CAPACITY
    n_bins = round(DURATION / BIN)
    bnd_top = top + len(ALGOS) * (panel_h + gap) + 40
    bnd_row = 26
    H = bnd_top + 50 + len(ALGOS) * bnd_row + 20
    x = lambda t: left + t / DURATION * plot_w  # noqa: E731
    bw = plot_w / n_bins

    o = []
    o.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">')
    o.append(f'<rect width="{W}" height="{H}" fill="#ffffff"/>')
    o.append(f'<text x="{left}" y="24" font-size="17" font-weight="bold">'
             'One traffic profile, four limiters: 10 req/s with bursts of 20</text>')
    o.append(f'<text x="{left}" y="44" fill="#444">Token bucket: capacity {CAPACITY}, '
             f'{RATE} per {PERIOD_MS} ms. Windows: {WINDOW_LIMIT} per {WINDOW_MS} ms. '
             'Bars: requests per 100 ms (left axis); line: limiter state (right axis).</text>')
    # legend
    lx = left
    for color, name in (("#2e9d4f", "granted"), ("#d8433a", "denied")):
        o.append(f'<rect x="{lx}" y="53" width="10" height="10" fill="{color}"/>')
        o.append(f'<text x="{lx + 14}" y="62">{name}</text>')
        lx += 80
    o.append(f'<line x1="{lx}" y1="58" x2="{lx + 18}" y2="58" stroke="#2563eb" stroke-width="2"/>')
    o.append(f'<text x="{lx + 24}" y="62">bucket tokens / window count</text>')

    for i, (label, cmd, args, state_name) in enumerate(ALGOS):
        py = top + i * (panel_h + gap) + 26
        y_b = lambda v: py + panel_h - v / bars_max * panel_h  # noqa: E731
        y_s = lambda v: py + panel_h - v / state_max * panel_h  # noqa: E731
        s = summary[i]
        o.append(f'<text x="{left}" y="{py - 8}" font-size="14" font-weight="bold">'
                 f'{esc(label)} <tspan font-weight="normal" fill="#555">'
                 f'({cmd} … {" ".join(map(str, args))})</tspan></text>')
        o.append(f'<text x="{W - right}" y="{py - 8}" text-anchor="end" fill="#333">'
                 f'burst 1st s: {s["burst_first_second"]} granted · '
                 f'14/s throttled after {esc(fmt_s(s["throttled_after_s"]))} · '
                 f'recovered {esc(fmt_s(s["recovered_after_s"]))} after</text>')
        # phases: the overload (burst + sustained) shaded in every panel,
        # their names in a row above the first panel
        for j, (pname, a, b, _) in enumerate(PHASES):
            if a >= BURST[1] and b <= SUSTAINED[2]:
                o.append(f'<rect x="{x(a):.1f}" y="{py}" width="{x(b) - x(a):.1f}" '
                         f'height="{panel_h}" fill="{"#fbe9e7" if j == 1 else "#f3f0f7"}"/>')
            if i == 0:
                yy = top - 6
                o.append(f'<line x1="{x(a) + 2:.1f}" y1="{yy}" x2="{x(b) - 2:.1f}" y2="{yy}" '
                         f'stroke="#999"/>')
                o.append(f'<text x="{(x(a) + x(b)) / 2:.1f}" y="{yy - 4}" '
                         f'text-anchor="middle" fill="#555" font-size="11">{esc(pname)}</text>')
        # grid + axes
        for v in range(0, bars_max + 1):
            yy = y_b(v)
            o.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{W - right}" y2="{yy:.1f}" '
                     f'stroke="#e2e2e2" stroke-width="1"/>')
            o.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end" fill="#555">{v}</text>')
        for v in range(0, state_max + 1, 5):
            o.append(f'<text x="{W - right + 6}" y="{y_s(v) + 4:.1f}" fill="#2563eb">{v}</text>')
        o.append(f'<text transform="translate({left - 34},{py + panel_h / 2}) rotate(-90)" '
                 f'text-anchor="middle" fill="#555" font-size="11">req / 100 ms</text>')
        o.append(f'<text transform="translate({W - right + 36},{py + panel_h / 2}) rotate(90)" '
                 f'text-anchor="middle" fill="#2563eb" font-size="11">{esc(state_name)}</text>')
        o.append(f'<line x1="{left}" y1="{py + panel_h}" x2="{W - right}" y2="{py + panel_h}" '
                 f'stroke="#333"/>')
        for t in range(0, int(DURATION) + 1):
            o.append(f'<line x1="{x(t):.1f}" y1="{py + panel_h}" x2="{x(t):.1f}" '
                     f'y2="{py + panel_h + 4}" stroke="#333"/>')
            if t % 2 == 0 or i == len(ALGOS) - 1:
                o.append(f'<text x="{x(t):.1f}" y="{py + panel_h + 16}" text-anchor="middle" '
                         f'fill="#555">{t}</text>')
        # bars
        granted = [0] * n_bins
        denied = [0] * n_bins
        for t, g, _ in results[i]:
            b = min(n_bins - 1, int(t / BIN + 1e-9))
            if g:
                granted[b] += 1
            else:
                denied[b] += 1
        for b in range(n_bins):
            bx = left + b * bw + 0.6
            if granted[b]:
                o.append(f'<rect x="{bx:.1f}" y="{y_b(granted[b]):.1f}" width="{bw - 1.2:.1f}" '
                         f'height="{granted[b] / bars_max * panel_h:.1f}" fill="#2e9d4f"/>')
            if denied[b]:
                o.append(f'<rect x="{bx:.1f}" y="{y_b(granted[b] + denied[b]):.1f}" '
                         f'width="{bw - 1.2:.1f}" height="{denied[b] / bars_max * panel_h:.1f}" '
                         f'fill="#d8433a"/>')
        # state line: tokens (bucket) or count = limit - remaining (windows)
        pts = []
        for t, rem in probes[i]:
            v = rem if cmd == "RL.TOKENBUCKET" else args[0] - rem
            pts.append(f"{x(t):.1f},{y_s(max(0, min(state_max, v))):.1f}")
        o.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#2563eb" '
                 f'stroke-width="1.8" stroke-linejoin="round"/>')
    o.append(f'<text x="{left + plot_w / 2}" y="{bnd_top - 22}" text-anchor="middle" fill="#555">'
             'time (s)</text>')
    # The boundary burst: one row per limiter, a square per request (time
    # runs left to right, the window boundary in the middle).
    half = BOUNDARY_N // 2
    o.append(f'<text x="{left}" y="{bnd_top}" font-size="14" font-weight="bold">'
             f'The boundary burst: {BOUNDARY_N} requests at {BOUNDARY_RATE}/s on fresh keys, '
             f'{half} just before a window boundary, {half} just after</text>')
    o.append(f'<text x="{left}" y="{bnd_top + 18}" fill="#444">A fixed window grants all of them '
             'in one second: its limit at the end of one window and again at the start of the next '
             '(up to 2 × limit across one boundary).</text>')
    label_w = 130
    sq = (plot_w - label_w - 250) / BOUNDARY_N
    bx0 = left + label_w
    mid = bx0 + half * sq
    y0 = bnd_top + 34
    o.append(f'<line x1="{mid:.1f}" y1="{y0 - 4}" x2="{mid:.1f}" y2="{y0 + len(ALGOS) * bnd_row}" '
             'stroke="#333" stroke-dasharray="4 3"/>')
    o.append(f'<text x="{mid:.1f}" y="{y0 + len(ALGOS) * bnd_row + 14}" text-anchor="middle" '
             'fill="#555" font-size="11">window boundary</text>')
    for i, ((label, _, _, _), grants) in enumerate(zip(ALGOS, boundary)):
        yy = y0 + i * bnd_row
        before, after = halves(grants)
        o.append(f'<text x="{left}" y="{yy + 14}">{esc(label)}</text>')
        for k, granted in enumerate(grants):
            o.append(f'<rect x="{bx0 + k * sq + 0.5:.1f}" y="{yy + 2}" width="{sq - 1:.1f}" '
                     f'height="{bnd_row - 8}" fill="{"#2e9d4f" if granted else "#d8433a"}"/>')
        o.append(f'<text x="{bx0 + BOUNDARY_N * sq + 12:.1f}" y="{yy + 14}" fill="#333">'
                 f'{before + after} granted ({before} before, {after} after)</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "demo.svg"),
                    help="where to write the chart (SVG); default docs/demo.svg")
    ap.add_argument("--redis", help="use this server (redis://host:port) instead of starting one")
    opts = ap.parse_args()

    server = None
    if opts.redis:
        r = redis.Redis.from_url(opts.redis)
    else:
        server = start_server()
        r = server.client()
    try:
        print(f"replaying the profile for {DURATION:g} s against the four commands ...",
              flush=True)
        results, probes, late = run(r, os.getpid())
        print("then a burst across a window boundary ...", flush=True)
        boundary, sides = run_boundary(r, os.getpid())
    finally:
        r.close()
        if server:
            server.close()
    summary = summarize(results, probes)
    print_summary(summary, late)
    print_boundary(boundary, sides)
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    with open(opts.out, "w") as f:
        f.write(svg_chart(results, probes, summary, boundary))
    print(f"\nchart: {os.path.relpath(opts.out)}")
    # The same chart as PNG (for viewers without SVG), rendered by librsvg's
    # rsvg-convert, which `make deps` installs.
    png = os.path.splitext(opts.out)[0] + ".png"
    rsvg = shutil.which("rsvg-convert")
    if rsvg:
        subprocess.run([rsvg, "-f", "png", "-o", png, opts.out], check=True)
        print(f"chart: {os.path.relpath(png)}")
    else:
        print("rsvg-convert not found (apt-get install librsvg2-bin): PNG not written")


if __name__ == "__main__":
    main()
