"""``prog.explain(html=path)`` and ``tg explain --html``: a plan as one self-contained page.

A table of steps says what runs; a picture says where the time goes and which steps were
fused. The page holds three views of one plan, all inline (CSS, a little JavaScript, SVG: it
opens offline and from an attachment, and names no URL):

- the graph, drawn here as SVG (no Graphviz needed): one box per step, laid out in rows by
  depth (a step sits one row below the deepest step it reads; one that reads only leaves,
  just above its first reader), colored by backend, outlined by device, its width growing
  with predicted time, faded when it runs once per binding; a fused or generated kernel is a
  group box holding the ops it covers;
- a step table (kernel, backend, device, what it computes, shape, source of the estimate,
  predicted and measured time, error) that sorts on a click on its header;
- a cost bar per layer: steps grouped by the layer their weights belong to (the name up to
  its first number, ``h.3``), a step without weights joining the layer of what it reads.

Every name a graph carries (leaves, kernels) is escaped: a node named ``<script>`` stays text.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping

from tensor_graphs.db.cost import format_seconds
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.planner.plan import Plan, Step, ops_inside, summary

# Fill colors by backend, in this order; a backend not listed takes the next of EXTRA.
BACKEND_COLORS = {
    "c": "#4e79a7",  # C and OpenBLAS
    "numpy": "#f28e2b",  # numpy on the host
    "torch": "#e15759",  # torch (CPU or GPU)
    "triton": "#b07aa1",  # Triton on a GPU
    "copy": "#9c9c9c",  # copies between devices
}
EXTRA = ("#59a14f", "#edc948", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac")
DEVICE_STROKES = {"cpu": ("#222", 1.0), "cuda": ("#000", 3.0)}  # outline color and width
BOX_H, GAP_X, GAP_Y, MIN_W, MAX_W, MAX_OPS = 30, 14, 46, 70, 240, 8
NO_LAYER = "(no layer)"


def esc(value) -> str:
    """Text safe in an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def step_layers(plan: Plan, producers: list[list[int]]) -> list[str]:
    """Per step the layer it belongs to: the prefix of the weights it reads (up to the first
    numeric part: ``h.3.attn.w`` -> ``h.3``), else the layer of the latest step it reads."""
    layers: list[str] = []
    for i, s in enumerate(plan.steps):
        names = sorted({n.name for n in _read_leaves(s) if n.op.name == WEIGHT and n.name})
        layer = next((_layer_of(n) for n in names), None)
        if layer is None:
            layer = next((layers[p] for p in sorted(producers[i], reverse=True)
                          if layers[p] != NO_LAYER), NO_LAYER)
        layers.append(layer)
    return layers


def _read_leaves(step: Step) -> list:
    found = [sl.node for sl in step.inputs if sl.node.op.is_leaf]
    for n in step.nodes:
        found += [x for x in n.inputs if x.op.is_leaf]
    return found


def _layer_of(name: str) -> str:
    parts = name.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:k + 1])
    return parts[0] if len(parts) > 1 else name


def producers_of(plan: Plan) -> list[list[int]]:
    """Per step the steps whose values it reads (through the plan's aliases)."""
    made: dict = {}
    for i, s in enumerate(plan.steps):
        made[s.slot] = i
        for a in s.also_slots:
            if a is not None:
                made[a] = i
    found = []
    for s in plan.steps:
        found.append(sorted({made[r] for r in (plan.resolve(x) for x in s.inputs)
                             if r in made}))
    return found


def _colors(plan: Plan) -> dict[str, str]:
    colors = dict(BACKEND_COLORS)
    extra = iter(EXTRA * 10)
    for b in sorted({s.kernel.backend for s in plan.steps}):
        if b not in colors:
            colors[b] = next(extra)
    return colors


def _kind(s: Step) -> str:
    if s.is_copy:
        return "copy"
    if getattr(s.kernel, "generated", False):
        return "generated"
    return "fused" if len(s.nodes) > 1 else "single"


def _computes(s: Step) -> str:
    if s.is_copy:
        return f"copy to {s.device}"
    if getattr(s.kernel, "generated", False):
        return f"generated: {ops_inside(s.nodes)}"
    fused = len(s.nodes) - 1
    return s.computes + (f" (+{fused} fused)" if fused else "")


def render(plan: Plan, *, title: str = "tensor_graphs plan",
           measured: Mapping[int, float] | None = None,
           device_name: Callable[[str], str] = lambda kind: kind,
           notes: tuple[str, ...] = ()) -> str:
    """The page (see the module doc). ``measured``: seconds per step index timed in the
    program (``runtime/trace.py``), shown beside the predictions; ``notes``: lines shown
    under the totals (which loop ran, how the times were taken)."""
    measured = dict(measured or {})
    producers = producers_of(plan)
    layers = step_layers(plan, producers)
    colors = _colors(plan)
    parts = [_HEAD.replace("{title}", esc(title)), f"<h1>{esc(title)}</h1>"]
    parts.append("<pre class='totals'>" + esc(summary(plan)) + "".join(
        "\n" + esc(n) for n in notes) + "</pre>")
    parts.append(_legend(plan, colors, device_name))
    parts.append("<h2>Graph</h2><div class='graph'>"
                 + _svg(plan, producers, colors, device_name, measured) + "</div>")
    parts.append("<h2>Cost per layer</h2>" + _layer_bars(plan, layers, colors))
    parts.append("<h2>Steps</h2><p class='hint'>Click a column's header to sort; click a row "
                 "to find its box in the graph.</p>" + _table(plan, layers, device_name,
                                                              measured))
    parts.append(_SCRIPT + "</body></html>\n")
    return "\n".join(parts)


def _legend(plan: Plan, colors: dict, device_name) -> str:
    used = sorted({s.kernel.backend for s in plan.steps})
    items = [f"<span class='key'><span class='swatch' style='background:{colors[b]}'></span>"
             f"{esc(b)}</span>" for b in used]
    devices = sorted({s.device for s in plan.steps})
    items += [f"<span class='key'><span class='swatch dev' style='border-width:"
              f"{DEVICE_STROKES.get(d, ('#000', 2.0))[1]}px'></span>{esc(device_name(d))}"
              "</span>" for d in devices]
    items.append("<span class='key'><span class='swatch group'></span>fused or generated "
                 "kernel (the ops inside)</span>")
    return "<div class='legend'>" + " ".join(items) + "</div>"


def _width(seconds: float, top: float) -> float:
    if top <= 0 or not math.isfinite(seconds):
        return MIN_W
    return MIN_W + (MAX_W - MIN_W) * math.sqrt(max(seconds, 0.0) / top)


def _svg(plan: Plan, producers: list[list[int]], colors: dict, device_name,
         measured: Mapping[int, float]) -> str:
    depth: list[int] = []
    for i in range(len(plan.steps)):
        depth.append(1 + max((depth[p] for p in producers[i]), default=-1))
    users: dict[int, list[int]] = {}
    for i, ps in enumerate(producers):
        for p in ps:
            users.setdefault(p, []).append(i)
    for i in range(len(plan.steps)):  # a step reading only leaves (a weight's transpose)
        if not producers[i] and users.get(i):  # sits just above its first reader
            depth[i] = max(min(depth[u] for u in users[i]) - 1, 0)
    top = max((s.cost for s in plan.steps if math.isfinite(s.cost)), default=0.0)
    rows: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        rows.setdefault(d, []).append(i)
    boxes: dict[int, tuple[float, float, float, float]] = {}
    y, width = 20.0, 0.0
    for d in sorted(rows):
        x, height = 20.0, 0.0
        for i in rows[d]:
            s = plan.steps[i]
            w = _width(s.cost, top)
            h = BOX_H
            if _kind(s) in ("fused", "generated"):
                shown = min(len(s.nodes), MAX_OPS) + (len(s.nodes) > MAX_OPS)
                w = max(w, 110.0)
                h = BOX_H + 18 * shown + 6
            boxes[i] = (x, y, w, h)
            x += w + GAP_X
            height = max(height, h)
        width = max(width, x)
        y += height + GAP_Y
    out = [f"<svg class='plan' width='{width + 20:.0f}' height='{y:.0f}' "
           f"viewBox='0 0 {width + 20:.0f} {y:.0f}' role='img'>",
           "<defs><marker id='arrow' viewBox='0 0 8 8' refX='8' refY='4' markerWidth='7' "
           "markerHeight='7' orient='auto'><path d='M0,0 L8,4 L0,8 z' fill='#888'/></marker>"
           "</defs>"]
    for i, ps in enumerate(producers):
        x1, y1, w1, _ = boxes[i]
        for p in ps:
            x0, y0, w0, h0 = boxes[p]
            a, b = (x0 + w0 / 2, y0 + h0), (x1 + w1 / 2, y1)
            mid = (a[1] + b[1]) / 2
            out.append(f"<path class='edge' d='M{a[0]:.1f},{a[1]:.1f} C{a[0]:.1f},{mid:.1f} "
                       f"{b[0]:.1f},{mid:.1f} {b[0]:.1f},{b[1]:.1f}' "
                       "marker-end='url(#arrow)'/>")
    for i, s in enumerate(plan.steps):
        out.append(_box(i, s, boxes[i], colors, device_name, measured.get(i)))
    out.append("</svg>")
    return "\n".join(out)


def _box(i: int, s: Step, box: tuple, colors: dict, device_name, measured) -> str:
    x, y, w, h = box
    kind = _kind(s)
    stroke, sw = DEVICE_STROKES.get(s.device, ("#000", 2.0))
    tip = (f"#{i} {s.kernel.name} ({s.kernel.backend}, {device_name(s.device)}): "
           f"{_computes(s)} {format_shape(s.node.shape)}"
           f"{' (once per binding)' if s.static else ''}; predicted "
           f"{format_seconds(s.cost)} ({s.source})"
           + (f", measured {format_seconds(measured)}" if measured is not None else ""))
    label = s.kernel.name if len(s.kernel.name) * 6.2 < w - 8 else \
        s.kernel.name[:max(int((w - 8) / 6.2) - 1, 3)] + "…"
    static = " static" if s.static else ""  # (runs once per binding: drawn faded)
    parts = [f"<g class='step {kind}{static}' id='step-{i}' data-step='{i}'>",
             f"<title>{esc(tip)}</title>"]
    dash = " stroke-dasharray='5,3'" if kind in ("fused", "generated") else ""
    fill = colors[s.kernel.backend]
    if kind in ("fused", "generated"):
        parts.append(f"<rect class='group' x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' "
                     f"height='{h:.1f}' rx='6' fill='{fill}' fill-opacity='0.18' "
                     f"stroke='{stroke}' stroke-width='{sw}'{dash}/>")
        parts.append(f"<text x='{x + 6:.1f}' y='{y + 19:.1f}' class='label'>{esc(label)}"
                     "</text>")
        ops = [n.op.name for n in s.nodes]
        shown = ops[:MAX_OPS] + ([f"+{len(ops) - MAX_OPS} more"] if len(ops) > MAX_OPS else [])
        for k, op in enumerate(shown):
            oy = y + BOX_H + 18 * k
            parts.append(f"<rect class='op' x='{x + 8:.1f}' y='{oy:.1f}' width='{w - 16:.1f}' "
                         f"height='15' rx='3' fill='{fill}'/>")
            parts.append(f"<text x='{x + 12:.1f}' y='{oy + 11.5:.1f}' class='oplabel'>"
                         f"{esc(op)}</text>")
    else:
        parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' "
                     f"rx='5' fill='{fill}' stroke='{stroke}' stroke-width='{sw}'/>")
        parts.append(f"<text x='{x + 6:.1f}' y='{y + 19:.1f}' class='label light'>"
                     f"{esc(label)}</text>")
    parts.append("</g>")
    return "".join(parts)


def _layer_bars(plan: Plan, layers: list[str], colors: dict) -> str:
    totals: dict[str, dict[str, float]] = {}
    order: list[str] = []
    for s, layer in zip(plan.steps, layers):
        if layer not in totals:
            order.append(layer)
        by = totals.setdefault(layer, {})
        cost = s.cost if math.isfinite(s.cost) else 0.0
        by[s.kernel.backend] = by.get(s.kernel.backend, 0.0) + cost
    top = max((sum(v.values()) for v in totals.values()), default=0.0) or 1.0
    rows = ["<table class='bars'>"]
    for layer in order:
        by = totals[layer]
        total = sum(by.values())
        segs = "".join(
            f"<span class='seg' style='width:{100 * v / top:.2f}%;background:{colors[b]}' "
            f"title='{esc(b)}: {esc(format_seconds(v))}'></span>"
            for b, v in sorted(by.items()) if v > 0)
        rows.append(f"<tr class='layer' data-layer='{esc(layer)}'><th>{esc(layer)}</th>"
                    f"<td class='bar'>{segs}</td><td class='num'>{esc(format_seconds(total))}"
                    "</td></tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _table(plan: Plan, layers: list[str], device_name, measured: Mapping[int, float]) -> str:
    head = [("#", "num"), ("kernel", "text"), ("backend", "text"), ("device", "text"),
            ("layer", "text"), ("computes", "text"), ("shape", "text"), ("source", "text"),
            ("predicted", "num"), ("measured", "num"), ("error", "num")]
    out = ["<table id='steps' class='steps'><thead><tr>"
           + "".join(f"<th data-type='{t}'>{esc(h)}</th>" for h, t in head)
           + "</tr></thead><tbody>"]
    for i, s in enumerate(plan.steps):
        m = measured.get(i)
        cells = [(str(i), i), (s.kernel.name, s.kernel.name), (s.kernel.backend, None),
                 (device_name(s.device), None), (layers[i], None),
                 (_computes(s) + (" (once per binding)" if s.static else ""), None),
                 (format_shape(s.node.shape), None), (s.source, None),
                 (format_seconds(s.cost), s.cost),
                 ("-" if m is None else format_seconds(m), -1 if m is None else m),
                 (f"{s.error:.0e}", s.error)]
        row = "".join(f"<td data-v='{esc(key if key is not None else text)}'>{esc(text)}</td>"
                      for text, key in cells)
        out.append(f"<tr data-step='{i}'>{row}</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
pre.totals { background: #f6f6f6; padding: .6em; white-space: pre-wrap; }
.legend .key { margin-right: 1.2em; white-space: nowrap; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: -2px;
          margin-right: .3em; border: 1px solid #222; }
.swatch.dev { background: #fff; border-style: solid; border-color: #000; }
.swatch.group { background: #fff; border: 1px dashed #222; }
.graph { overflow: auto; max-height: 80vh; border: 1px solid #ddd; }
svg.plan .edge { fill: none; stroke: #aaa; stroke-width: 1.2; }
svg.plan .label { font: 12px monospace; fill: #111; }
svg.plan .label.light { fill: #fff; }
svg.plan .oplabel { font: 11px monospace; fill: #fff; }
svg.plan .step.static { opacity: .55; }
svg.plan .step.hit rect { stroke: #ff0 !important; stroke-width: 4 !important; }
table.steps { border-collapse: collapse; font: 12px monospace; }
table.steps th, table.steps td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
table.steps th { cursor: pointer; background: #eee; position: sticky; top: 0; }
table.steps tr:hover { background: #ffd; }
table.bars { border-collapse: collapse; width: 100%; font: 12px monospace; }
table.bars th { text-align: left; padding-right: 1em; white-space: nowrap; width: 10%; }
td.bar { width: 80%; } td.num { text-align: right; white-space: nowrap; }
.seg { display: inline-block; height: 14px; }
.hint { color: #666; }
</style></head><body>"""

_SCRIPT = """<script>
(function () {
  var table = document.getElementById('steps');
  var heads = table.tHead.rows[0].cells;
  for (var c = 0; c < heads.length; c++) {
    heads[c].addEventListener('click', (function (col) {
      return function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var num = heads[col].getAttribute('data-type') === 'num';
        var dir = heads[col].getAttribute('data-dir') === 'asc' ? -1 : 1;
        for (var k = 0; k < heads.length; k++) heads[k].removeAttribute('data-dir');
        heads[col].setAttribute('data-dir', dir === 1 ? 'asc' : 'desc');
        rows.sort(function (a, b) {
          var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
          if (num) { return dir * (parseFloat(x) - parseFloat(y)); }
          return dir * (x < y ? -1 : x > y ? 1 : 0);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      };
    })(c));
  }
  table.tBodies[0].addEventListener('click', function (e) {
    var row = e.target.closest('tr'); if (!row) return;
    var old = document.querySelectorAll('svg.plan .step.hit');
    for (var k = 0; k < old.length; k++) old[k].classList.remove('hit');
    var box = document.getElementById('step-' + row.getAttribute('data-step'));
    if (box) { box.classList.add('hit'); box.scrollIntoView({block: 'center'}); }
  });
})();
</script>"""


def write_html(plan: Plan, path, **options) -> str:
    """Render ``plan`` (``render``'s options) into ``path``, written whole or not at all;
    returns the page."""
    from tensor_graphs.files import atomic_write

    page = render(plan, **options)
    with atomic_write(path, what="HTML report") as f:
        f.write(page)
    return page

