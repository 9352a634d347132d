"""The profile as one self-contained HTML page: graph (Graphviz SVG, inlined), time bars, roofline, tables.

Nothing is fetched when the page opens: styles and every picture are inline. The graph needs the `graphviz`
Python package and Graphviz's `dot` program; without them the page says so and keeps the rest.
"""

from __future__ import annotations

import html
import math
import re

from tvm_fusion.build.memory import format_bytes

__all__ = ["render", "graph_svg", "time_chart_svg", "roofline_svg"]

PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd",
           "#ccebc5", "#ffed6f", "#d9d9d9"]
CANDIDATE_COLOR = "#d62728"
DECLINED_COLOR = "#ff7f0e"
E = html.escape


def rule_colors(report) -> dict[str, str]:
    rules = sorted({g.rule for g in report.groups})
    return {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(rules)}


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


# ---------------------------------------------------------------- graph
def _node_times(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in report.builds["unfused"].sites:
        for n in s.onnx_nodes:
            out.setdefault(n, []).append(s)
    return out


def graph_svg(report) -> tuple[str | None, str]:
    """(inline SVG or None, a message saying why not)."""
    try:
        import graphviz
    except ImportError:
        return None, "The graph needs the graphviz Python package (pip install graphviz) and Graphviz's dot program."
    colors = rule_colors(report)
    g = graphviz.Digraph("model", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "nodesep": "0.15",
                                              "ranksep": "0.25", "tooltip": report.model},
                         node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "white",
                                    "fontname": "Helvetica", "fontsize": "10", "height": "0.3"},
                         edge_attr={"arrowsize": "0.5", "color": "#777777"})
    ops = {n["name"]: n["op"] for n in report.onnx_graph.get("nodes", [])}
    times = _node_times(report)
    marks: dict[str, tuple[str, list[str]]] = {}
    for d in report.declined:
        marks.setdefault(d["onnx_node"], (DECLINED_COLOR, []))[1].append(f"declined {d['rule']}: {d['reason']}")
    for c in report.candidates:
        if c.kind == "elementwise chain":
            for n in c.onnx_nodes:
                marks[n] = (CANDIDATE_COLOR, [f"fusion candidate ({c.kind}, saves {c.bytes_saved / 1e6:.2f} MB, "
                                              f"{c.launches_saved} launches)"] + c.reasons)

    def node(graph, name: str, fill: str = "white") -> None:
        sites = times.get(name, [])
        tip = [f"{name} ({ops.get(name, '?')})"] + [f"unfused kernel {s.kernel}: {_ms(s.median)}" for s in sites]
        attrs = {"fillcolor": fill}
        if name in marks:
            color, reasons = marks[name]
            tip += reasons
            attrs.update(color=color, penwidth="2.5", style="rounded,filled,dashed")
        graph.node(name, f"{name}\n{ops.get(name, '')}", tooltip="\n".join(tip)[:1500], **attrs)

    placed = set()
    fused_sites = {s.group: s for s in report.builds["fused"].sites if s.group is not None}
    for grp in report.groups:
        members = [n for n in grp.onnx_nodes if n in ops and n not in placed]
        if not members:
            continue
        k = fused_sites.get(grp.index)
        tip = (f"group {grp.index}: rule {grp.rule}\nkernel {grp.kernel}"
               f"{f' ({_ms(k.median)})' if k else ''}\nbefore {_ms(grp.before_s)} in {grp.before_launches} "
               f"launches, after {_ms(grp.after_s)}\nsaved {grp.bytes_saved / 1e6:.2f} MB\n{grp.attrs}")
        with g.subgraph(name=f"cluster_group{grp.index}") as c:
            c.attr(label=grp.rule, style="filled,rounded", fillcolor=colors[grp.rule], color="#555555",
                   fontsize="9", tooltip=tip[:1500], id=f"group{grp.index}")
            for n in members:
                node(c, n, "#ffffffcc")
                placed.add(n)
    for n in ops:
        if n not in placed:
            node(g, n)
    for src, dst, _ in report.onnx_graph.get("edges", []):
        g.edge(src, dst)
    try:
        svg = g.pipe(format="svg").decode()
    except graphviz.ExecutableNotFound:
        return None, ("Graphviz's dot program was not found on PATH, so the graph is left out "
                      "(apt-get install graphviz, or brew install graphviz); the tables below are complete.")
    return svg[svg.index("<svg"):], ""


# ---------------------------------------------------------------- charts
def time_chart_svg(report, width: int = 900) -> str:
    """Per fused group: the summed time of its original kernels (unfused build) above the fused kernel's."""
    colors = rule_colors(report)
    row, label_w = 22, 230
    groups = report.groups
    top = max([g.before_s for g in groups] + [g.after_s for g in groups] + [1e-12])
    h = 40 + row * len(groups)
    scale = (width - label_w - 130) / top  # room for the figures after the longest bar
    out = [f'<svg id="chart-time" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
           f'font-family="Helvetica" font-size="11">',
           f'<text x="{label_w}" y="14">time per group, before (grey: original ops, unfused build) and after '
           f'(colour: fused kernel)</text>']
    for i, g in enumerate(groups):
        y = 26 + i * row
        out.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">#{g.index} {E(g.rule)}</text>')
        for dy, value, fill, what in ((0, g.before_s, "#bbbbbb", "before"), (9, g.after_s, colors[g.rule], "after")):
            w = max(1.0, value * scale)
            out.append(f'<rect class="bar" x="{label_w}" y="{y + dy}" width="{w:.1f}" height="8" fill="{fill}">'
                       f'<title>#{g.index} {E(g.rule)} {what}: {_ms(value)}</title></rect>')
        out.append(f'<text x="{label_w + max(g.before_s, g.after_s) * scale + 4:.1f}" y="{y + 12}" '
                   f'fill="#444">{g.before_s * 1e3:.2f} / {g.after_s * 1e3:.2f} ms</text>')
    out.append("</svg>")
    return "\n".join(out)


def roofline_svg(report, width: int = 640, height: int = 420) -> str:
    """Log-log roofline: every kernel call of each build at (FLOP/byte, achieved FLOP/s) under the two roofs."""
    p = report.peaks
    pts = [(m, s) for m, b in report.builds.items() for s in b.sites if s.flops > 0 and s.median > 0 and s.nbytes]
    xs = [s.intensity for _, s in pts] + [p.ridge]
    x0, x1 = 10 ** math.floor(math.log10(min(xs)) - 0.5), 10 ** math.ceil(math.log10(max(xs)) + 0.5)
    y1 = 10 ** math.ceil(math.log10(p.flops) + 0.3)
    y0 = 10 ** math.floor(math.log10(min([s.flops / s.median for _, s in pts] + [p.flops / 1e3])) - 0.3)
    ml, mb, mt, mr = 60, 40, 30, 20

    def X(v):
        return ml + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * (width - ml - mr)

    def Y(v):
        return height - mb - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (height - mb - mt)

    out = [f'<svg id="chart-roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="Helvetica" font-size="11">',
           f'<rect x="{ml}" y="{mt}" width="{width - ml - mr}" height="{height - mt - mb}" fill="none" stroke="#999"/>',
           f'<text x="{ml}" y="18">roofline: {p.bandwidth / 1e9:.1f} GB/s, {p.flops / 1e9:.1f} GFLOP/s</text>',
           f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>',
           f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">FLOP/s</text>']
    for e in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        out.append(f'<text x="{X(10 ** e):.1f}" y="{height - mb + 14}" text-anchor="middle">1e{e}</text>')
    for e in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        out.append(f'<text x="{ml - 4}" y="{Y(10 ** e) + 4:.1f}" text-anchor="end">1e{e}</text>')
    xa = max(x0, y0 / p.bandwidth)
    out.append(f'<polyline class="roof" fill="none" stroke="#000" stroke-width="2" points="{X(xa):.1f},'
               f'{Y(xa * p.bandwidth):.1f} {X(p.ridge):.1f},{Y(p.flops):.1f} {X(x1):.1f},{Y(p.flops):.1f}"/>')
    fill = {"unfused": "#999999", "tvm": "#2ca02c", "fused": "#1f77b4"}
    for m, s in pts:
        out.append(f'<circle class="point {m}" cx="{X(s.intensity):.1f}" cy="{Y(s.flops / s.median):.1f}" r="3.5" '
                   f'fill="{fill.get(m, "#000")}" fill-opacity="0.7"><title>{m} {E(s.kernel)} ({E(s.origin)}): '
                   f'{s.intensity:.1f} FLOP/B, {s.flops / s.median / 1e9:.2f} GFLOP/s, {_ms(s.median)}</title></circle>')
    for i, (m, color) in enumerate((k, v) for k, v in fill.items() if k in report.builds):
        out.append(f'<circle cx="{ml + 16}" cy="{mt + 16 + 16 * i}" r="4" fill="{color}"/>'
                   f'<text x="{ml + 26}" y="{mt + 20 + 16 * i}">{m}</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------- tables and page
def _table(header: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{E(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{E(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _nodes(nodes, limit=6) -> str:
    return ", ".join(nodes[:limit]) + (f" +{len(nodes) - limit}" if len(nodes) > limit else "")


def _memory(report) -> list[str]:
    """Each build's peak activation memory from TVM's memory plan (build/memory.py)."""
    plans = [(m, b.memory) for m, b in report.builds.items() if b.memory is not None]
    if not plans:
        return []
    return ['<h2 id="memory">Peak activation memory (TVM\'s static memory plan)</h2>',
            "<p>The storages TVM's StaticPlanBlockMemory allocates for the intermediates (each reused by the "
            "tensors whose lifetimes do not overlap) plus the outputs; inputs and weights are not counted. A fused "
            "group's <i>peak saved</i> is the storage the plan gives its intermediates when its ops run unfused.</p>",
            _table(["build", "peak activation MB", "storages", "storage MB", "tensors on them", "outputs MB"],
                   [[m, format_bytes(p.peak).removesuffix(" MB"), len(p.storages),
                     format_bytes(p.planned).removesuffix(" MB"), p.tensors,
                     format_bytes(p.unplanned).removesuffix(" MB")] for m, p in plans], "memory")]


def _tables(report) -> str:
    parts = ["<h2>Builds</h2>", _table(
        ["build", "kernel calls", "latency", "sum of kernels", "instrument + dispatch / call", "traffic MB"],
        [[m, len([s for s in b.sites if s.times]), _ms(b.latency), _ms(b.kernel_time),
          f"{b.overhead_per_call * 1e6:.1f} us", f"{sum(s.nbytes for s in b.sites if s.times) / 1e6:.1f}"]
         for m, b in report.builds.items()])]
    parts += _memory(report)
    parts += ["<h2>Fused groups: before / after</h2>", _table(
        ["#", "rule", "kernel", "ONNX nodes", "before", "after", "launches", "saved MB", "intermediates",
         "still reads MB", "still writes MB", "GFLOP", "FLOP/B", "of roofline", "peak saved MB"],
        [[g.index, g.rule, g.kernel, _nodes(g.onnx_nodes), _ms(g.before_s), _ms(g.after_s),
          f"{g.before_launches} -> {g.after_launches}", f"{g.bytes_saved / 1e6:.2f}",
          "; ".join(f"{i['name']} {'x'.join(map(str, i['shape']))} {i['dtype']}" for i in g.intermediates),
          f"{g.reads / 1e6:.2f}", f"{g.writes / 1e6:.2f}", f"{g.flops / 1e9:.3f}",
          f"{g.flops / max(1, g.reads + g.writes):.1f}", f"{g.roofline_fraction:.0%}",
          "-" if g.storage_saved is None else f"{g.storage_saved / 1e6:.2f}"] for g in report.groups],
        "groups")]
    parts += ["<h2>What to fuse next</h2>", _table(
        ["#", "kind", "ops", "ONNX nodes", "saves MB", "launches", "est. saving", "measured", "why it is unfused"],
        [[i, c.kind, " -> ".join(c.ops), _nodes(c.onnx_nodes), f"{c.bytes_saved / 1e6:.2f}", c.launches_saved,
          _ms(c.seconds_saved), _ms(c.measured_s), " | ".join(c.reasons)]
         for i, c in enumerate(report.candidates, 1)], "candidates")]
    if report.declined:
        parts += ["<h2>Declined matches (explain)</h2>", _table(
            ["ONNX node", "rule", "reason"], [[d["onnx_node"], d["rule"], d["reason"]] for d in report.declined])]
    for m, b in report.builds.items():
        parts += [f"<h2>Kernels: {m} build</h2>", _table(
            ["kernel", "rule / op", "ONNX nodes", "calls", "median", "share", "GFLOP", "MB moved"],
            [[k["kernel"], k["origin"], _nodes(k["onnx_nodes"]), k["calls"], _ms(k["median_s"]),
              f"{k['share']:.1%}", f"{k['flops'] / 1e9:.3f}", f"{(k['reads'] + k['writes']) / 1e6:.2f}"]
             for k in b.kernels()], f"kernels {m}")]
    return "\n".join(parts)


STYLE = """body{font-family:Helvetica,Arial,sans-serif;margin:20px;color:#222}
table{border-collapse:collapse;font-size:12px;margin-bottom:16px}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#eee}.graph{overflow:auto;max-height:900px;border:1px solid #ccc}
.note{background:#fff3cd;padding:8px;border:1px solid #e0c060}.legend span{display:inline-block;padding:2px 6px;
margin:2px;border:1px solid #888;font-size:12px}h1{font-size:20px}h2{font-size:16px;margin-top:24px}"""


def render(report) -> str:
    svg, why = graph_svg(report)
    legend = "".join(f'<span style="background:{c}">{E(r)}</span>' for r, c in rule_colors(report).items())
    legend += (f'<span style="border:2px dashed {CANDIDATE_COLOR}">fusion candidate</span>'
               f'<span style="border:2px dashed {DECLINED_COLOR}">declined by a rule</span>')
    graph = f'<div class="graph">{svg}</div>' if svg else f'<p class="note" id="graph-missing">{E(why)}</p>'
    p = report.peaks
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tvm-fusion profile: {E(report.model)}</title>
<style>{STYLE}</style></head><body>
<h1>tvm-fusion profile: {E(re.sub(r'^.*/', '', report.model))}</h1>
<p id="summary"><b>{E(report.summary())}</b></p>
<p id="memory-summary"><b>{E(report.memory_summary())}</b></p>
<p>{E(report.device)}; target {E(report.target)}; medians of {report.repeat} inferences.
Roofs: {p.bandwidth / 1e9:.1f} GB/s, {p.flops / 1e9:.1f} GFLOP/s ({E(p.source)}).</p>
<h2>Graph: each fused group is one box, coloured by rule</h2>
<p class="legend">{legend}</p>
{graph}
<h2>Time per fused group, before and after</h2>
{time_chart_svg(report)}
<h2>Roofline</h2>
{roofline_svg(report)}
{_tables(report)}
</body></html>
"""
