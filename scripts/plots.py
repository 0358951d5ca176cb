#!/usr/bin/env python3
"""Draw kiroku's benchmark plots as SVG, from the --json output of the benchmarks.

    scripts/plots.py wal    WAL.json...    [-o docs/wal-latency.svg]      [--note TEXT]...
    scripts/plots.py ledger LEDGER.json... [-o docs/ledger-throughput.svg] [--note TEXT]...

wal     reads `kiroku bench wal --curve --json` (a list of runs, one per sync mode and
        offered rate, then the raw reference) and draws latency against load: p50 and p99
        append latency of each mode against the offered appends/s, and below it the
        records each fdatasync covered. Closed-loop runs (rate 0) are hollow markers at
        the rate they achieved; the raw write+fdatasync reference is a star.
ledger  reads one or more `kiroku bench ledger --json` outputs and draws committed tx/s
        against client threads, one line per file; with --validator on, also the
        Validator-off run of the same invocation; the floor (GetTxState round trips/s,
        the benchmark's same-run baseline) dashed.

A file name of - reads standard input. The figures say what they were measured with
(workload, backend, record size, ...); put the date, the machine and the command in
--note lines. Plain Python 3, no third-party packages: the SVG is written by hand.
"""

import argparse
import datetime
import json
import math
import os
import sys
from xml.sax.saxutils import escape

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Colours that stay apart for the colour-blind (Okabe-Ito), then greys.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]
FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""


# ---- axes --------------------------------------------------------------------

def nice_step(span, target):
    """A round step (1, 2 or 5 × 10^k) that cuts span into about target parts."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


class Axis:
    """Maps data values to pixels, linear or log10, and makes its ticks."""

    def __init__(self, lo, hi, p0, p1, log=False, zero=False):
        if log:
            lo, hi = max(lo, 1e-12), max(hi, 1e-12)
            self.lo = 10 ** math.floor(math.log10(lo))
            self.hi = 10 ** math.ceil(math.log10(hi))
            if self.hi <= self.lo:
                self.hi = self.lo * 10
        else:
            if zero:
                lo = min(lo, 0.0)
            if hi <= lo:
                hi = lo + 1
            step = nice_step(hi - lo, 6)
            self.lo = math.floor(lo / step) * step
            self.hi = math.ceil(hi / step) * step
            self.step = step
        self.p0, self.p1, self.log = p0, p1, log

    def __call__(self, v):
        if self.log:
            v = max(v, self.lo)
            f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo)
        return self.p0 + f * (self.p1 - self.p0)

    def ticks(self):
        """(value, label, major) for each gridline."""
        out = []
        if self.log:
            e0, e1 = round(math.log10(self.lo)), round(math.log10(self.hi))
            few = e1 - e0 <= 3
            for e in range(e0, e1 + 1):
                out.append((10.0 ** e, fmt_num(10.0 ** e), True))
                if e < e1:
                    for m in (2, 5) if few else ():
                        out.append((m * 10.0 ** e, fmt_num(m * 10.0 ** e), False))
                    for m in (3, 4, 6, 7, 8, 9) if few else (2, 3, 4, 5, 6, 7, 8, 9):
                        out.append((m * 10.0 ** e, "", False))
        else:
            n = int(round((self.hi - self.lo) / self.step))
            for i in range(n + 1):
                v = self.lo + i * self.step
                out.append((v, fmt_num(v), True))
        return out


def fmt_num(v):
    """1.5k, 20k, 2M, 0.5 ..."""
    a = abs(v)
    if a >= 1e6:
        s, unit = v / 1e6, "M"
    elif a >= 1e3:
        s, unit = v / 1e3, "k"
    else:
        s, unit = v, ""
    if abs(s - round(s)) < 1e-9:
        return "%d%s" % (round(s), unit)
    return ("%.2f" % s).rstrip("0").rstrip(".") + unit


def fmt_us(v):
    """A latency in µs, in the unit that reads best."""
    if v >= 1e6:
        return fmt_num(v / 1e6) + " s"
    if v >= 1e3:
        return fmt_num(v / 1e3) + " ms"
    return fmt_num(v) + " µs"


# ---- SVG ---------------------------------------------------------------------

class SVG:
    def __init__(self, width, height):
        self.w, self.h = width, height
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill="#222", rotate=None, cls=None):
        t = ' transform="rotate(%d %.1f %.1f)"' % (rotate, x, y) if rotate is not None else ""
        self.add('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s"%s>%s</text>'
                 % (x, y, size, anchor, weight, fill, t, escape(s)))

    def line(self, x1, y1, x2, y2, stroke="#000", width=1.0, dash=None):
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.2f"%s/>'
                 % (x1, y1, x2, y2, stroke, width, d))

    def polyline(self, pts, stroke, width=2.0, dash=None):
        if len(pts) < 2:
            return
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<polyline fill="none" stroke="%s" stroke-width="%.2f" stroke-linejoin="round"%s points="%s"/>'
                 % (stroke, width, d, " ".join("%.1f,%.1f" % p for p in pts)))

    def marker(self, x, y, colour, shape="circle", hollow=False, tip=None):
        fill = "#fff" if hollow else colour
        t = "<title>%s</title>" % escape(tip) if tip else ""
        if shape == "circle":
            self.add('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" stroke="%s" stroke-width="1.5">%s</circle>'
                     % (x, y, fill, colour, t))
        elif shape == "square":
            self.add('<rect x="%.1f" y="%.1f" width="7" height="7" fill="%s" stroke="%s" stroke-width="1.5">%s</rect>'
                     % (x - 3.5, y - 3.5, fill, colour, t))
        elif shape == "star":
            pts = []
            for i in range(10):
                r = 7 if i % 2 == 0 else 3
                a = math.pi / 2 + i * math.pi / 5
                pts.append("%.1f,%.1f" % (x + r * math.cos(a), y - r * math.sin(a)))
            self.add('<polygon points="%s" fill="%s" stroke="%s" stroke-width="1">%s</polygon>'
                     % (" ".join(pts), fill, colour, t))

    def render(self):
        head = ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>\n'
                '<rect width="100%%" height="100%%" fill="#fff"/>\n' % (self.w, self.h, self.w, self.h, FONT))
        return head + "\n".join(self.parts) + "\n</svg>\n"


class Panel:
    """A plotting area with its axes, gridlines and labels."""

    def __init__(self, svg, x, y, w, h, xaxis, yaxis, xlabel, ylabel, xfmt=fmt_num, yfmt=fmt_num):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.X, self.Y = xaxis, yaxis
        for v, label, major in yaxis.ticks():
            py = yaxis(v)
            if py < y - 0.5 or py > y + h + 0.5:
                continue
            svg.line(x, py, x + w, py, stroke="#e3e3e3" if major else "#f2f2f2", width=1)
            if label:
                svg.text(x - 6, py + 4, yfmt(v) if yfmt is not fmt_num else label, size=11, anchor="end", fill="#444")
        for v, label, major in xaxis.ticks():
            px = xaxis(v)
            if px < x - 0.5 or px > x + w + 0.5:
                continue
            svg.line(px, y, px, y + h, stroke="#e3e3e3" if major else "#f2f2f2", width=1)
            if label:
                svg.text(px, y + h + 16, label, size=11, anchor="middle", fill="#444")
        svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888" stroke-width="1"/>'
                % (x, y, w, h))
        svg.text(x + w / 2, y + h + 36, xlabel, size=12, anchor="middle")
        svg.text(x - 58, y + h / 2, ylabel, size=12, anchor="middle", rotate=-90)

    def inside(self, px, py):
        return self.x - 1 <= px <= self.x + self.w + 1 and self.y - 1 <= py <= self.y + self.h + 1


def legend(svg, x, y, entries, width=None):
    """entries: (colour, dash, shape, hollow, label). Drawn in rows from (x, y)."""
    row = 0
    for colour, dash, shape, hollow, label in entries:
        yy = y + row * 18
        if dash is not False:
            svg.line(x, yy - 4, x + 26, yy - 4, stroke=colour, width=2, dash=dash)
        if shape:
            svg.marker(x + 13, yy - 4, colour, shape, hollow)
        svg.text(x + 34, yy, label, size=11)
        row += 1
    return y + row * 18


def header(svg, title, subtitle_lines):
    svg.text(20, 28, title, size=16, weight="bold")
    y = 48
    for line in subtitle_lines:
        svg.text(20, y, line, size=11, fill="#555")
        y += 15
    return y


# ---- input -------------------------------------------------------------------

def load(path):
    if path == "-":
        data = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as f:
            data = f.read()
    # Tolerate progress lines before the JSON (stderr redirected into the file).
    start = min([i for i in (data.find("["), data.find("{")) if i >= 0] or [0])
    try:
        return json.loads(data[start:])
    except json.JSONDecodeError as e:
        sys.exit("%s: not the JSON of a kiroku bench --json run: %s" % (path, e))


def mtime_date(paths):
    for p in paths:
        if p != "-":
            return datetime.date.fromtimestamp(os.path.getmtime(p)).isoformat()
    return datetime.date.today().isoformat()


# ---- wal ---------------------------------------------------------------------

def xval(r):
    """Where a run sits on the load axis: its offered rate, or for a closed loop
    (offered 0) the rate it achieved."""
    return r.get("offered_per_s") or r["appends_per_s"]


def plot_wal(paths, out, notes):
    runs = []
    for p in paths:
        d = load(p)
        if not isinstance(d, list) or not all(isinstance(r, dict) and "appends_per_s" in r for r in d):
            sys.exit("%s: expected the list that `kiroku bench wal --json` prints" % p)
        runs.extend(d)
    if not runs:
        sys.exit("no runs to plot")
    delays = sorted({r.get("sync_delay_us", 0) for r in runs})
    series = {}  # label -> runs, in the order first seen
    raws = []
    for r in runs:
        if r.get("mode") == "raw":
            raws.append(r)
            continue
        label = r.get("policy") or r.get("mode")
        if len(delays) > 1 and r.get("sync_delay_us"):
            label += ", fsync +%s" % fmt_us(r["sync_delay_us"])
        series.setdefault(label, []).append(r)
    for rs in series.values():
        # By offered load, closed loop (rate 0) last.
        rs.sort(key=lambda r: r.get("offered_per_s") or float("inf"))

    pts = [r for r in runs if r["appends_per_s"] > 0]
    xs = [xval(r) for r in pts]
    lat = [v for r in runs for v in (r.get("latency_p50_us", 0), r.get("latency_p99_us", 0), r.get("latency_mean_us", 0)) if v > 0]
    rpf = [r["records_per_fsync"] for r in runs if r.get("records_per_fsync", 0) > 0]
    if not pts or not lat:
        sys.exit("the runs hold no appends")

    W, H = 900, 760
    svg = SVG(W, H)
    r0 = runs[0]
    sub = ["%d-byte records, %d writers. Open loop: at the offered rate (latency counts from when an append was due);"
           % (r0.get("record_size", 0), r0.get("writers", 0)),
           "hollow: closed loop, at the rate it achieved. Hover a point for its figures."]
    if delays != [0]:
        sub.append("EMULATED SLOW DEVICE: every fsync delayed by %s (--sync-delay)"
                   % ", ".join(fmt_us(d) for d in delays if d))
    sub += notes
    top = header(svg, "kiroku write-ahead log: append latency against load", sub) + 12

    left, pw = 90, 560
    X = Axis(min(xs), max(xs), left, left + pw, log=True)
    h1 = 330
    Y1 = Axis(min(lat), max(lat), top + h1, top, log=True)
    p1 = Panel(svg, left, top, pw, h1, X, Y1, "", "append latency", yfmt=fmt_us)
    top2 = top + h1 + 56
    h2 = H - top2 - 60
    Y2 = Axis(min(rpf or [1]), max(rpf or [1]), top2 + h2, top2, log=True)
    Panel(svg, left, top2, pw, h2, X, Y2, "appends/s offered (open loop) or achieved (closed loop)", "records per fdatasync")

    entries = []
    for i, (label, rs) in enumerate(series.items()):
        c = PALETTE[i % len(PALETTE)]
        open_ = [r for r in rs if r.get("offered_per_s") and r["appends_per_s"] > 0]
        for key, dash in (("latency_p50_us", None), ("latency_p99_us", "6,4")):
            svg.polyline([(X(xval(r)), Y1(r[key])) for r in open_ if r.get(key, 0) > 0], c, dash=dash)
        svg.polyline([(X(xval(r)), Y2(r["records_per_fsync"])) for r in open_ if r.get("records_per_fsync", 0) > 0], c)
        for r in rs:
            if r["appends_per_s"] <= 0:
                continue
            closed = not r.get("offered_per_s")
            offered = "closed loop" if closed else "offered %s/s" % fmt_num(r["offered_per_s"])
            tip = "%s, %s: %s appends/s achieved, %.1f records/fsync, mean %s, p50 %s, p99 %s, p999 %s" % (
                label, offered, fmt_num(round(r["appends_per_s"])), r.get("records_per_fsync", 0),
                fmt_us(r.get("latency_mean_us", 0)), fmt_us(r.get("latency_p50_us", 0)),
                fmt_us(r.get("latency_p99_us", 0)), fmt_us(r.get("latency_p999_us", 0)))
            for key in ("latency_p50_us", "latency_p99_us"):
                if r.get(key, 0) > 0:
                    svg.marker(X(xval(r)), Y1(r[key]), c, "circle" if key == "latency_p50_us" else "square", closed, tip)
            if r.get("records_per_fsync", 0) > 0:
                svg.marker(X(xval(r)), Y2(r["records_per_fsync"]), c, "circle", closed, tip)
        entries.append((c, None, None, False, label))
    for r in raws:
        tip = "raw write+fdatasync, %d records per sync: %s records/s, mean %s" % (
            r.get("records_per_fsync", 0), fmt_num(round(r["appends_per_s"])), fmt_us(r.get("latency_mean_us", 0)))
        if r.get("latency_mean_us", 0) > 0:
            svg.marker(X(r["appends_per_s"]), Y1(r["latency_mean_us"]), "#000", "star", False, tip)
        if r.get("records_per_fsync", 0) > 0:
            svg.marker(X(r["appends_per_s"]), Y2(r["records_per_fsync"]), "#000", "star", False, tip)

    lx = left + pw + 24
    y = legend(svg, lx, top + 8, entries)
    y = legend(svg, lx, y + 10, [
        ("#555", None, "circle", False, "p50 latency"),
        ("#555", "6,4", "square", False, "p99 latency"),
        ("#555", False, "circle", True, "closed loop (rate 0)"),
    ])
    if raws:
        y = legend(svg, lx, y + 10, [("#000", False, "star", False, "raw write + fdatasync")])
        svg.text(lx + 34, y - 3, "(same disk, same run;", size=11, fill="#555")
        svg.text(lx + 34, y + 12, "mean latency)", size=11, fill="#555")
    svg.text(lx, top2 + 14, "Records each fsync", size=11, fill="#555")
    svg.text(lx, top2 + 29, "covered: what a sync", size=11, fill="#555")
    svg.text(lx, top2 + 44, "policy saves in fsyncs.", size=11, fill="#555")
    write(out, svg)


# ---- ledger ------------------------------------------------------------------

def plot_ledger(paths, out, notes, floor_line=True):
    docs = []
    for p in paths:
        d = load(p)
        if not isinstance(d, dict) or not isinstance(d.get("points"), list):
            sys.exit("%s: expected the object that `kiroku bench ledger --json` prints" % p)
        docs.append(d)
    threads = sorted({pt["threads"] for d in docs for pt in d["points"]})
    if not threads:
        sys.exit("no points to plot")

    def describe(d, keys):
        parts = []
        for k in keys:
            v = d.get(k)
            if k == "workload":
                parts.append(str(v).upper())
            elif k == "backend":
                parts.append(str(v).split(" (")[0])
            elif k == "auth":
                parts.append(str(v).upper())
            elif k == "records":
                parts.append("%s assets" % fmt_num(d.get("load", {}).get("records", 0)))
        return ", ".join(parts)

    # Label each file by what differs between the files.
    keys = ["workload", "backend", "auth", "records"]
    differ = [k for k in keys if len({json.dumps(d.get(k) if k != "records" else d.get("load", {}).get("records")) for d in docs}) > 1]
    same = [k for k in keys if k not in differ]
    lines = []  # (label, colour, dash, [(threads, value, tip)])
    ci = 0
    for d in docs:
        base = describe(d, differ or ["workload"])
        c = PALETTE[ci % len(PALETTE)]
        ci += 1
        on = d.get("validator") == "on"
        name = base + (", through the Validator" if on else "")
        pts = [(pt["threads"], pt["tx_per_s"], pt) for pt in d["points"]]
        lines.append((name, c, None, "circle", pts))
        if on and all(pt.get("validator_off") for pt in d["points"]):
            off = [(pt["threads"], pt["validator_off"]["tx_per_s"], pt["validator_off"]) for pt in d["points"]]
            lines.append((base + ", Validator off (same run)", c, "2,3", "square", off))
        floor = [(pt["threads"], pt.get("floor_rpc_per_s", 0), None) for pt in d["points"] if pt.get("floor_rpc_per_s", 0) > 0]
        if floor and floor_line:
            lines.append((base + ": floor, GetTxState rpc/s (baseline)", c, "6,4", None, floor))

    W, H = 900, 560
    svg = SVG(W, H)
    d0 = docs[0]
    sub = []
    if same:
        sub.append("%s; %d-byte payload, proofs on" % (describe(d0, same), d0.get("payload", 0)))
    else:
        sub.append("%d-byte payload, proofs on" % d0.get("payload", 0))
    vdb = {d.get("validator_db") for d in docs if d.get("validator") == "on"}
    if vdb:
        sub.append("Validator database: %s" % ", ".join(sorted(vdb)))
    sub += notes
    top = header(svg, "kiroku ledger: committed transactions per second against client threads", sub) + 12

    left, pw, ph = 90, 520, H - top - 70
    # Threads on a log2 scale: 1, 4, 16, 64 are evenly spaced.
    tmin, tmax = min(threads), max(threads)
    span = max(math.log2(tmax) - math.log2(tmin), 1)

    def tx(t):
        return left + 20 + (math.log2(t) - math.log2(tmin)) / span * (pw - 40)

    vals = [v for _, _, _, _, pts in lines for _, v, _ in pts]
    Y = Axis(0, max(vals), top + ph, top, zero=True)

    class TAxis:
        def ticks(self):
            return [(t, str(t), True) for t in threads]

        def __call__(self, t):
            return tx(t)

    Panel(svg, left, top, pw, ph, TAxis(), Y, "client threads (closed loop)", "per second")
    entries = []
    for name, c, dash, shape, pts in lines:
        svg.polyline([(tx(t), Y(v)) for t, v, _ in pts], c, width=2 if shape else 1.5, dash=dash)
        for t, v, pt in pts:
            if shape and pt is not None:
                lat = pt.get("latency", {})
                tip = "%s, %d threads: %s tx/s, p50 %s, p99 %s%s" % (
                    name, t, fmt_num(round(v)), fmt_us(lat.get("p50_us", 0)), fmt_us(lat.get("p99_us", 0)),
                    ", %.0f CPU µs/tx" % pt["cpu_us_per_tx"] if pt.get("cpu_us_per_tx") else "")
                svg.marker(tx(t), Y(v), c, shape, False, tip)
        entries.append((c, dash, shape, False, name))
    lx = left + pw + 24
    y = top + 8
    for c, dash, shape, hollow, name in entries:
        # Long labels wrap at ", " to fit beside the plot.
        words, rows, cur = name.split(", "), [], ""
        for w in words:
            nxt = (cur + ", " + w) if cur else w
            if len(nxt) > 34 and cur:
                rows.append(cur + ",")
                cur = w
            else:
                cur = nxt
        rows.append(cur)
        legend(svg, lx, y, [(c, dash, shape, hollow, rows[0])])
        for i, r in enumerate(rows[1:]):
            svg.text(lx + 34, y + 15 * (i + 1), r, size=11)
        y += 18 + 15 * (len(rows) - 1) + 4
    write(out, svg)


def write(out, svg):
    d = os.path.dirname(out)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(svg.render())
    os.replace(tmp, out)
    print("wrote %s" % out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="plot", required=True)
    for name, default in (("wal", "docs/wal-latency.svg"), ("ledger", "docs/ledger-throughput.svg")):
        p = sub.add_parser(name, help="plot `kiroku bench %s --json` output" % name)
        p.add_argument("files", nargs="+", help="JSON files (- for standard input)")
        p.add_argument("-o", "--out", default=os.path.join(REPO, default), help="SVG to write (default: %s)" % default)
        p.add_argument("--note", action="append", default=[],
                       help="a line under the title: date, machine, command (repeatable)")
        p.add_argument("--no-date", action="store_true", help="do not add the JSON file's date as a note")
        if name == "ledger":
            p.add_argument("--no-floor", action="store_true",
                           help="leave out the floor (GetTxState rpc/s), the same-run baseline")
    a = ap.parse_args(argv)
    notes = list(a.note)
    if not a.no_date:
        notes.append("measured: %s (the JSON file's date)" % mtime_date(a.files))
    if a.plot == "wal":
        plot_wal(a.files, a.out, notes)
    else:
        plot_ledger(a.files, a.out, notes, floor_line=not a.no_floor)


if __name__ == "__main__":
    main(sys.argv[1:])
