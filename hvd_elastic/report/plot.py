"""The run's picture: loss (top) and world size (bottom) over time, membership changes marked on both.

Stretches without committed steps (a reset or restart in progress) are shaded and no line crosses them.

Drawn with matplotlib's headless Agg backend (no display needed), to a PNG of
:data:`SIZE_PX` pixels.  Times are seconds since the run's first record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .runlog import RunLog
from .timeline import Timeline

#: Width and height of the PNG in pixels (FIGSIZE inches at DPI).
FIGSIZE = (12.0, 7.0)
DPI = 100
SIZE_PX = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))

# One colour per kind of change, the same in the legend and on both axes.
_COLOURS = {"removed": "tab:orange", "added": "tab:green", "mixed": "tab:olive", "failure": "tab:red",
            "restart": "tab:purple"}
_LABELS = {"removed": "host removed", "added": "host added", "mixed": "hosts changed",
           "failure": "worker failed (rollback)", "restart": "job restarted from checkpoint"}


def draw(run: RunLog, timeline: Timeline, path: str | Path) -> Path:
    """Write the PNG to ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: never try a display
    import matplotlib.pyplot as plt

    t0 = timeline.start or 0.0
    fig, (ax_loss, ax_size) = plt.subplots(2, 1, sharex=True, figsize=FIGSIZE, dpi=DPI,
                                           gridspec_kw={"height_ratios": [3, 2]})
    try:
        gaps = [(a - t0, b - t0) for a, b in timeline.stalls]
        for ax in (ax_loss, ax_size):
            for i, (a, b) in enumerate(gaps):
                ax.axvspan(a, b, color="0.92", zorder=0,
                           label="no steps committed (reset or restart)" if i == 0 and ax is ax_size else None)
        _draw_loss(ax_loss, run, t0, gaps)
        _draw_sizes(ax_size, run, t0, gaps)
        _draw_changes(ax_loss, ax_size, timeline, t0)
        _draw_drains(ax_size, run, t0)
        for ax, where in ((ax_loss, "upper right"), (ax_size, "lower right")):
            if ax.get_legend_handles_labels()[0]:  # an empty run has nothing to explain
                ax.legend(loc=where, fontsize=8, framealpha=0.9)
        ax_loss.set_xlim(left=0)
        fig.suptitle(f"hvd-elastic run {run.directory.name}: loss and world size; dashed lines: membership changes")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def _draw_loss(ax, run: RunLog, t0: float, gaps: list[tuple[float, float]]) -> None:
    losses = [(r["time"] - t0, r["loss"]) for r in run.progress if isinstance(r.get("loss"), (int, float))]
    if losses:
        for i, segment in enumerate(_split(losses, gaps)):
            ax.plot(*zip(*segment), color="tab:blue", linewidth=1.2,
                    label="training loss (rank 0, per step)" if i == 0 else None)
    else:
        ax.text(0.5, 0.5, "no loss in progress.jsonl", transform=ax.transAxes, ha="center", color="grey")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)


def _draw_sizes(ax, run: RunLog, t0: float, gaps: list[tuple[float, float]]) -> None:
    sizes = [(t - t0, s) for t, s in run.sizes()]
    if sizes:
        for i, segment in enumerate(_split(sizes, gaps)):
            ax.step(*zip(*segment), where="post", color="black", linewidth=1.5,
                    label="world size (workers) while training" if i == 0 else None)
        top = max(s for _, s in sizes)
        ax.set_ylim(0, top + 1)
        ax.set_yticks(range(0, top + 2))
    ax.set_ylabel("world size")
    ax.set_xlabel("seconds since the run started")
    ax.grid(alpha=0.3)


def _draw_changes(ax_loss, ax_size, timeline: Timeline, t0: float) -> None:
    """A dashed line per membership change on both panels, its cause named above the loss."""
    seen: set[str] = set()
    for number, change in enumerate(timeline.changes):
        at = (change.cause["time"] if change.cause else change.time) - t0
        colour = _COLOURS.get(change.kind, "grey")
        label = None if change.kind in seen else _LABELS.get(change.kind, change.kind)
        seen.add(change.kind)
        for ax in (ax_loss, ax_size):
            ax.axvline(at, color=colour, linestyle="--", linewidth=1.2, label=label if ax is ax_loss else None)
        if change.cause:  # name the action above the loss plot, where lines are easiest to follow
            text = f"{change.cause['action']} {change.cause.get('host') or ''}".strip()
            # Alternate heights, so labels of events close in time do not overlap.
            ax_loss.annotate(text, xy=(at, 1.0 if number % 2 == 0 else 0.7), xycoords=("data", "axes fraction"),
                             xytext=(2, -4), textcoords="offset points", rotation=90, va="top", fontsize=8,
                             color=colour)


def _draw_drains(ax, run: RunLog, t0: float) -> None:
    """A marker at the top of the size panel where a straggler's drain was asked for, its host named."""
    drains = [e for e in run.events if e["event"] == "straggler_drain" and e.get("status") == "requested"]
    for i, event in enumerate(drains):
        at = event["time"] - t0
        ax.plot([at], [1.0], marker="v", color="tab:brown", markersize=9, transform=ax.get_xaxis_transform(),
                clip_on=False, linestyle="none", label="straggler drain asked" if i == 0 else None)
        ax.annotate(str(event.get("slow_host", "")), xy=(at, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(4, -10), textcoords="offset points", fontsize=8, color="tab:brown")


def _split(points: Sequence[tuple[float, float]], gaps: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """``points`` cut into runs at the ``gaps``, so no line is drawn across a stretch without steps."""
    segments: list[list[tuple[float, float]]] = [[]]
    starts = iter(sorted(b for _, b in gaps))
    next_start = next(starts, None)
    for point in points:
        while next_start is not None and point[0] >= next_start:
            if segments[-1]:
                segments.append([])
            next_start = next(starts, None)
        segments[-1].append(point)
    return [s for s in segments if s]
