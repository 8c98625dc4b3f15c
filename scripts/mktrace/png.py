"""PNG timeline: one panel per rank, SMs x time, one row per (SM, lane), coloured by role;
waits are grey (red when they timed out). Each remote chunk's arrival is a triangle on the
panel's top row, joined by a thin line to the start of the first tile that consumed it."""
from .analysis import arrivals
from .fmt import LANE_NAMES

COLOURS = {"producer": "#4c72b0", "consumer": "#55a868", "storer": "#8172b2",
           "comm-send": "#dd8452", "comm-recv": "#c44e52", "proxy": "#937860"}
WAIT, TIMEOUT = "#bbbbbb", "#d62728"


def _rows(t):
    keys = sorted({(e.sm, e.lane) for e in t.events})
    return {k: i + 1 for i, k in enumerate(keys)}  # row 0 is for arrivals


def render(traces, path, title=None, dpi=110):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    traces = [t for t in traces if t.events]
    t0 = min(e.start for t in traces for e in t.events)
    rows = [_rows(t) for t in traces]
    heights = [len(r) + 1 for r in rows]
    fig, axes = plt.subplots(len(traces), 1, figsize=(12, 1.2 + 0.16 * sum(heights)),
                             sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    arr = arrivals(traces)
    for ax, t, row in zip(axes[:, 0], traces, rows):
        _draw_rank(ax, t, row, t0, arr)
    axes[-1, 0].set_xlabel("time (us)")
    handles = [Patch(color=c, label=r) for r, c in COLOURS.items()
               if any(e.role == r for t in traces for e in t.events)]
    handles += [Patch(color=WAIT, label="wait"), Patch(color=TIMEOUT, label="timed-out wait")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.975), ncol=len(handles),
               fontsize=8, frameon=False)
    fig.suptitle(title or f"{traces[0].op_name}, {len(traces)} ranks", y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _draw_rank(ax, t, row, t0, arr):
    bars = {}
    for e in t.events:
        colour = (TIMEOUT if e.timed_out else WAIT) if e.kind == "wait" else COLOURS.get(e.role)
        bars.setdefault((row[(e.sm, e.lane)], colour), []).append(
            ((e.start - t0) / 1e3, max(e.dur / 1e3, 0.05)))
    for (y, colour), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colour, edgecolor="white", linewidth=0.3)
    first_use = {}
    for e in t.events:
        if e.role == "producer" and e.kind == "tile" and (t.rank, e.flag) in arr:
            if e.flag not in first_use or e.start < first_use[e.flag].start:
                first_use[e.flag] = e
    for flag, use in first_use.items():
        x_arr, x_use = (arr[(t.rank, flag)] - t0) / 1e3, (use.start - t0) / 1e3
        ax.plot([x_arr], [0], marker="v", color="black", markersize=4)
        ax.plot([x_arr, x_use], [0, row[(use.sm, use.lane)]], color="black", linewidth=0.4,
                alpha=0.5)
        ax.plot([x_use], [row[(use.sm, use.lane)]], marker="|", color="black", markersize=7)
    labels = ["arrivals"] + [f"SM{sm} {LANE_NAMES[lane]}" for sm, lane in sorted(row)]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=5)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_ylabel(f"rank {t.rank}", fontsize=9)
    ax.grid(axis="x", linewidth=0.3)
