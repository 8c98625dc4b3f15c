"""PNG timeline: one panel per rank, one row per SM (its lanes merged onto that row), time
across. Tiles and chunks are coloured by role (neighbours alternate two shades so their
boundaries show); waits are a thin grey strip on top (red when they timed out). Above each
panel's SMs an "arrivals" row holds a triangle per remote row-block's arrival on that rank,
joined by a thin line to the start of the first tile that used it (analysis.first_uses).

The figure's size does not grow with the SM count: a real trace (132 SMs x 5 lanes per
rank) must stay one readable picture, about 1540 x 1420 px for 2 ranks."""
from .analysis import arrivals, first_uses

COLOURS = {"producer": "#4c72b0", "consumer": "#55a868", "storer": "#8172b2",
           "comm-send": "#dd8452", "comm-recv": "#c44e52", "proxy": "#937860"}
SHADES = {"producer": "#3a5a8f", "consumer": "#3b8a4f", "storer": "#675a99",
          "comm-send": "#b8622f", "comm-recv": "#9e3336", "proxy": "#75603f"}
WAIT, TIMEOUT = "#9a9a9a", "#d62728"
# Drawn in this order, later over earlier: a merged row shows the consumers' tiles over the
# producer's loads, and communication over both.
LAYERS = ("producer", "storer", "consumer", "comm-recv", "proxy", "comm-send")
BAR, WAIT_H = 0.84, 0.36  # heights within a row of 1
WIDTH_IN, DPI = 14.0, 110
HEAD_IN, FOOT_IN, MAX_IN = 0.6, 0.55, 14.5  # title + legend, x axis, whole figure
# Above MANY SMs in a rank: rows touch, comm rows are COMM_ROW rows tall, and only every
# TICK_EVERY-th SM is labelled.
MANY, COMM_ROW, TICK_EVERY = 40, 2.5, 16


def panel_inches(nrows, nranks):
    """A rank's panel height: ~0.04 in per SM row, within [1.6, 6] in and the figure cap."""
    budget = (MAX_IN - HEAD_IN - FOOT_IN) / max(nranks, 1)
    return min(max(1.6, 0.04 * nrows + 0.6), 6.0, budget)


def render(traces, path, title=None, dpi=DPI):
    """Writes the PNG; returns {"size": (w, h) px, "ranks": [{rank, rows, arrivals, linked}]}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = [t for t in traces if t.events]
    if not traces:
        raise ValueError("no events in these traces: nothing to draw")
    t0 = min(e.start for t in traces for e in t.events)
    t_end = max(e.end for t in traces for e in t.events)
    heights = [panel_inches(len({e.sm for e in t.events}), len(traces)) for t in traces]
    fig_h = HEAD_IN + FOOT_IN + sum(heights)
    fig, axes = plt.subplots(len(traces), 1, figsize=(WIDTH_IN, fig_h), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    arr, uses = arrivals(traces), first_uses(traces)
    stats = []
    for ax, t in zip(axes[:, 0], traces):
        stats.append(_draw_rank(ax, t, t0, t_end, arr, uses))
    axes[-1, 0].set_xlabel("time (us) from the first event of any rank", fontsize=9)
    axes[-1, 0].set_xlim(0, (t_end - t0) / 1e3 * 1.005)
    fig.tight_layout(rect=(0, 0, 1, 1 - HEAD_IN / fig_h), h_pad=0.6)  # before the title:
    # tight_layout would make room for it again
    handles = _legend(traces)
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 10), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.32 / fig_h))
    fig.suptitle(title or f"{traces[0].op_name}, {len(traces)} ranks", y=1 - 0.06 / fig_h,
                 fontsize=11)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    with open(path, "rb") as f:  # the size as written (PNG IHDR), not as computed
        head = f.read(24)
    size = (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big"))
    return {"size": size, "ranks": stats}


def _comm_sms(t):
    return {e.sm for e in t.events if e.role in ("comm-send", "comm-recv", "proxy")}


def _layout(t):
    """{sm: (top, height)} in row units from y = 0 down: the communication SMs first (right
    under the arrivals they cause; COMM_ROW tall when there are many SMs, so a few comm SMs
    among a hundred GEMM SMs still show), then the others by SM id."""
    comm = _comm_sms(t)
    sms = sorted({e.sm for e in t.events}, key=lambda sm: (sm not in comm, sm))
    tall = COMM_ROW if len(sms) > MANY else 1.0
    out, y = {}, 0.0
    for sm in sms:
        h = tall if sm in comm else 1.0
        out[sm] = (y, h)
        y += h
    return out


def _legend(traces):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    present = {e.role for t in traces for e in t.events if e.kind != "wait"}
    handles = [Patch(color=COLOURS[r], label=f"{r} {'chunk' if r.startswith('comm') else 'tile'}")
               for r in LAYERS[::-1] if r in present]
    kinds = {(e.kind, e.timed_out) for t in traces for e in t.events}
    if ("wait", False) in kinds:
        handles.append(Patch(color=WAIT, label="wait"))
    if ("wait", True) in kinds:
        handles.append(Patch(color=TIMEOUT, label="timed-out wait"))
    handles.append(Line2D([], [], color="black", marker="v", linestyle="none", markersize=5,
                          label="row-block arrived"))
    handles.append(Line2D([], [], color="black", linewidth=0.8, marker="o", markersize=2.5,
                          label="-> first tile using it"))
    return handles


def _bars(t, rows, t0, min_us, gap):
    """{(layer, colour): [(x, y top, width, height)]} for the rank's events."""
    from collections import defaultdict
    out = defaultdict(list)
    lanes = defaultdict(list)
    for e in t.events:
        lanes[(e.sm, e.lane, e.kind == "wait")].append(e)
    for (sm, _lane, is_wait), evs in lanes.items():
        top, h = rows[sm]
        pad = (1 - BAR) / 2 if gap else 0.0
        for i, e in enumerate(sorted(evs, key=lambda e: e.start)):
            x0, w = (e.start - t0) / 1e3, max(e.dur / 1e3, min_us)
            if is_wait:
                key = (len(LAYERS), TIMEOUT if e.timed_out else WAIT)
                out[key].append((x0, top + h / 2 - WAIT_H / 2, w, WAIT_H))
            else:
                layer = LAYERS.index(e.role) if e.role in LAYERS else 0
                key = (layer, (COLOURS if i % 2 == 0 else SHADES).get(e.role, "#555555"))
                out[key].append((x0, top + pad, w, h - 2 * pad))
    return out


def _draw_rank(ax, t, t0, t_end, arr, uses):
    from matplotlib.collections import PolyCollection
    rows = _layout(t)
    n = len(rows)
    bottom = max(top + h for top, h in rows.values())
    min_us = (t_end - t0) / 1e3 / 1500  # about a pixel: a short wait stays visible
    gap = n <= MANY  # few SMs: a gap between rows; many: rows touch (crisp pixels)
    for (layer, colour), rects in sorted(_bars(t, rows, t0, min_us, gap).items()):
        verts = [[(x, y), (x + w, y), (x + w, y + h), (x, y + h)] for x, y, w, h in rects]
        ax.add_collection(PolyCollection(verts, facecolors=colour, edgecolors="none",
                                         linewidths=0, antialiaseds=False, zorder=2 + layer))
    band = max(1.5, 0.07 * bottom)  # the arrivals row, in SM rows
    y_arr = -band / 2
    ax.axhspan(-band, 0, color="#f2f2f2", zorder=0)
    ax.axhline(0, color="#888888", linewidth=0.5, zorder=1)
    mine = {flag: ns for (rank, flag), ns in arr.items() if rank == t.rank}
    linked = 0
    for flag, ns in sorted(mine.items()):
        x_arr = (ns - t0) / 1e3
        ax.plot([x_arr], [y_arr], marker="v", color="black", markersize=4.5, zorder=20)
        use = uses.get((t.rank, flag))
        if use is None:
            continue
        linked += 1
        x_use, y_use = (use.start - t0) / 1e3, rows[use.sm][0] + rows[use.sm][1] / 2
        ax.plot([x_arr, x_use], [y_arr, y_use], color="black", linewidth=0.5, alpha=0.45,
                zorder=19)
        ax.plot([x_use], [y_use], marker="o", color="black", markersize=2.2, zorder=20)
    _label_rows(ax, t, rows, y_arr, band, bottom)
    return {"rank": t.rank, "rows": n, "arrivals": len(mine), "linked": linked}


def _label_rows(ax, t, rows, y_arr, band, bottom):
    n = len(rows)
    comm = _comm_sms(t)
    order = sorted(rows, key=rows.get)
    mid = {sm: top + h / 2 for sm, (top, h) in rows.items()}
    ticks = [(y_arr, "arrivals")]
    if n > MANY:  # every TICK_EVERY-th SM; the comm block gets one label
        if comm:
            end = rows[order[len(comm) - 1]]
            ticks.append(((end[0] + end[1]) / 2, f"comm SMs ({len(comm)})"))
            ax.axhline(end[0] + end[1], color="#888888", linewidth=0.4, zorder=1)
        rest = order[len(comm):]
        ticks += [(mid[sm], f"SM {sm}") for i, sm in enumerate(rest) if i % TICK_EVERY == 0]
    else:
        ticks += [(mid[sm], f"SM {sm}" + (" comm" if sm in comm else "")) for sm in order]
    ax.set_yticks([y for y, _ in ticks])
    ax.set_yticklabels([s for _, s in ticks], fontsize=7 if n > MANY else 6)
    for label, (_, text) in zip(ax.get_yticklabels(), ticks):
        if "comm" in text:
            label.set_color(SHADES["comm-send"])
    ax.set_ylim(bottom, -band)
    ax.set_ylabel(f"rank {t.rank}", fontsize=10)
    ax.grid(axis="x", linewidth=0.3, color="#cccccc", zorder=0)
    ax.set_axisbelow(True)
