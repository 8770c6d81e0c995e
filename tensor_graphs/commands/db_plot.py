"""``tg db plot KERNEL -o plot.png``: a kernel's measured points and the cost model's curve.

An ``interpolated`` estimate is a power law fitted through the measured rows nearest in
roofline work (``db/cost.py``); when a plan's time looks wrong, the question is which rows it
leaned on. The plot answers it: per class of signatures the model fits together (same input
dtypes and ranks), the measured rows as points and the model's own answer along a sweep of
work as the curve, solid between the measured points and dotted where it extrapolates; the
roofline estimate (what an unmeasured kernel would get) dashed; rows of an older source of
the kernel, which the fit ignores, hollow.

The curve is the model's code answering (``CostModel.estimate`` at scaled features), not a
second fit drawn here, so it cannot disagree with what the planner reads.
"""

from __future__ import annotations

import json
import math

from tensor_graphs.errors import DatabaseError, TensorGraphsError

PLOT_INSTALL = 'pip install "tensor_graphs[plot]"'
FEATURES = {  # --x choice -> (axis label, value of a (flops, bytes, work) point)
    "work": ("roofline work at peak rates, seconds (the model's interpolation axis)",
             lambda flops, moved, work: work),
    "flops": ("floating-point operations", lambda flops, moved, work: flops),
    "bytes": ("bytes read and written", lambda flops, moved, work: moved),
}
SWEEP = 64  # points along each curve


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or an error naming the install."""
    try:
        import matplotlib
    except ImportError:
        raise TensorGraphsError(f"tg db plot draws with matplotlib, which is not installed: "
                                f"{PLOT_INSTALL}") from None
    matplotlib.use("Agg", force=True)  # no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def _classes(rows) -> dict[tuple, list]:
    from tensor_graphs.db.cost import _shape_class

    found: dict[tuple, list] = {}
    for r in rows:
        try:
            key = _shape_class(r.signature)
        except (ValueError, TypeError, AttributeError):
            continue
        found.setdefault(key, []).append(r)
    return found


def _label(key: tuple) -> str:
    return ", ".join(f"{dtype} rank {rank}" for rank, dtype in key) or "no inputs"


def plot_kernel(db, name: str, path: str, feature: str = "work") -> dict:
    """Draw ``name``'s rows in ``db`` and the model's curve into ``path`` (PNG); returns what
    was drawn: {"points": n, "classes": n, "curve_points": n}."""
    from tensor_graphs import kernels
    from tensor_graphs.compiler import cost_model
    from tensor_graphs.db.cost import measured_on
    from tensor_graphs.db.features import Features

    kernel = next((k for k in kernels.all() if k.name == name), None)
    if kernel is None:
        raise DatabaseError(f"no kernel named {name!r} is registered, so its rows cannot be "
                            "costed (tg kernels list shows the names)")
    kind = measured_on(kernel)
    model = cost_model(db, [kind])
    rows = [r for r in db.rows_for(name, model.hardware[kind])
            if r.flops is not None and r.bytes is not None and r.seconds > 0]
    if not rows:
        elsewhere = sorted({r.hardware.key for r in db.rows(kernel=name) if r.ok and r.hardware})
        where = (f"; it has rows under other hardware keys ({', '.join(elsewhere)}: another "
                 "machine, library or thread count)") if elsewhere else ""
        raise DatabaseError(f"{db.path} has no measured rows of {name} on this hardware "
                            f"({model.hardware[kind].key}){where}: `tg profile GRAPH` measures "
                            "the kernels a graph's plans consider here (tg db show --kernel "
                            f"{name} lists its rows)")
    plt = _pyplot()
    label, axis = FEATURES[feature]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = {"points": 0, "classes": 0, "curve_points": 0}
    for n, (key, members) in enumerate(sorted(_classes(rows).items())):
        color = colors[n % len(colors)]
        current = [r for r in members if r.source_hash == kernel.source_hash]
        stale = [r for r in members if r.source_hash != kernel.source_hash]

        def xy(r):
            work = model.kernel_work(kernel, Features(r.flops, r.bytes, 0.0))
            return axis(r.flops, r.bytes, work), r.seconds

        if current:
            xs, ys = zip(*map(xy, current))
            ax.scatter(xs, ys, color=color, zorder=3, label=f"measured: {_label(key)}")
            drawn["points"] += len(current)
        if stale:
            xs, ys = zip(*map(xy, stale))
            ax.scatter(xs, ys, facecolors="none", edgecolors=color, zorder=3,
                       label=f"older source (ignored): {_label(key)}")
            drawn["points"] += len(stale)
        if not current:
            continue
        drawn["classes"] += 1
        base = min(current, key=lambda r: r.flops + r.bytes)
        base_work = model.kernel_work(kernel, Features(base.flops, base.bytes, 0.0))
        works = [model.kernel_work(kernel, Features(r.flops, r.bytes, 0.0)) for r in current]
        lo, hi = min(works), max(works)
        # a signature of this class that no row has: the model must interpolate, not look up
        probe = json.dumps({"inputs": [[[0] * rank, dtype] for rank, dtype in key],
                            "attrs": {"plot_probe": True}})
        sweep = [lo / 8 * (hi * 8 / (lo / 8)) ** (k / (SWEEP - 1)) for k in range(SWEEP)]
        inside, outside, roof = [], [], []
        for w in sweep:
            s = w / base_work
            feats = Features(base.flops * s, base.bytes * s, 0.0)
            est = model._interpolate(kernel, probe, feats)  # noqa: SLF001 - the model's fit
            x = axis(feats.flops, feats.bytes, w)
            if est is not None and math.isfinite(est.seconds):
                (inside if lo <= w <= hi else outside).append((x, est.seconds))
            roof.append((x, model.roofline(kernel, feats).seconds))
        for part, style in ((inside, "-"), (outside, ":")):
            if part:
                ax.plot(*zip(*part), style, color=color, lw=1.6)
        ax.plot(*zip(*roof), "--", color=color, lw=0.9, alpha=0.6)
        drawn["curve_points"] += len(inside) + len(outside)
    ax.plot([], [], "k-", label="interpolated (within the measured range)")
    ax.plot([], [], "k:", label="extrapolated")
    ax.plot([], [], "k--", alpha=0.6, lw=0.9, label="roofline estimate (unmeasured)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("seconds per call (fastest run)")
    ax.set_title(f"{name} on {model.hardware[kind].key}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    from tensor_graphs.files import atomic_write

    with atomic_write(path, "wb", what="PNG image") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return drawn
