"""Diagrams the decks show, written as SVG by code so they stay true to what they draw.

Each `draw_*` returns the SVG text. What a collective leaves on each rank comes from `collective`,
the sampler's shards from torch's own `DistributedSampler`, DDP's buckets from
`utils.ddp_timing.ddp_bucket_bytes` (the rule torch applies). Text is plain SVG text in the browser's
sans-serif font, so nothing is fetched.
"""
from __future__ import annotations

import math
from html import escape

BLUES = ("#eef3fb", "#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c")
RANKS = "abcdefgh"
COLLECTIVES = ("broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter", "all_to_all")


def _svg(width: int, height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="15">\n<rect width="{width}" height="{height}" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def _text(x, y, text, size=15, anchor="middle", colour="#222", weight="normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{colour}" '
            f'font-weight="{weight}" dominant-baseline="middle">{escape(str(text))}</text>')


def _box(x, y, w, h, fill, text="", size=14, colour="#222", stroke="#444") -> str:
    out = f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" stroke="{stroke}" rx="3"/>'
    return out + (_text(x + w / 2, y + h / 2, text, size, colour=colour) if text != "" else "")


def _arrow(x1, y1, x2, y2, colour="#c0392b", width=2.5, dash=False) -> str:
    angle = math.atan2(y2 - y1, x2 - x1)
    head = [(x2, y2), (x2 - 11 * math.cos(angle - 0.4), y2 - 11 * math.sin(angle - 0.4)),
            (x2 - 11 * math.cos(angle + 0.4), y2 - 11 * math.sin(angle + 0.4))]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in head)
    style = ' stroke-dasharray="6,4"' if dash else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" stroke-width="{width}"{style}/>'
            f'<polygon points="{points}" fill="{colour}"/>')


# --- collectives --------------------------------------------------------------------------------

def collective(name: str, p: int = 4):
    """(before, after): what every rank holds, ``[rank][slot]`` -> a label or None, around one call
    with root 0. ``a2`` is rank a's chunk 2; ``S2`` the sum of every rank's chunk 2."""
    own = [[f"{RANKS[r]}{c}" for c in range(p)] for r in range(p)]
    total = [f"S{c}" for c in range(p)]
    one = [[f"{RANKS[r]}{r}" if c == r else None for c in range(p)] for r in range(p)]   # one chunk each
    if name == "broadcast":
        return own, [list(own[0]) for _ in range(p)]
    if name == "reduce":             # only the destination receives the result (torch's docs of dist.reduce)
        return own, [list(total)] + [list(row) for row in own[1:]]
    if name == "all_reduce":
        return own, [list(total) for _ in range(p)]
    if name == "scatter":
        return [list(own[0])] + [[None] * p for _ in range(p - 1)], \
            [[own[0][c] if c == r else None for c in range(p)] for r in range(p)]
    if name == "gather":
        return one, [[one[c][c] for c in range(p)]] + [list(row) for row in one[1:]]
    if name == "all_gather":
        return one, [[one[c][c] for c in range(p)] for _ in range(p)]
    if name == "reduce_scatter":
        return own, [[total[c] if c == r else None for c in range(p)] for r in range(p)]
    if name == "all_to_all":         # chunk j of rank i goes to rank j, into slot i
        return own, [[own[i][j] for i in range(p)] for j in range(p)]
    raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")


def _grid(x0, y0, state, cell=52, gap=6) -> list[str]:
    body = []
    for r, row in enumerate(state):
        y = y0 + r * (cell * 0.72 + gap)
        body.append(_text(x0 - 12, y + cell * 0.36, f"rank {r}", 14, anchor="end"))
        for c, label in enumerate(row):
            x = x0 + c * (cell + gap)
            if label is None:
                body.append(_box(x, y, cell, cell * 0.72, "#f4f4f4", stroke="#bbb"))
            else:
                fill = BLUES[4] if label.startswith("S") else BLUES[1 + "abcdefgh".index(label[0]) % 3]
                body.append(_box(x, y, cell, cell * 0.72, fill, label.replace("S", "Σ"), 15,
                                 colour="white" if label.startswith("S") else "#222"))
    return body


def draw_collective(name: str, p: int = 4) -> str:
    before, after = collective(name, p)
    cell, gap = 52, 6
    grid_w = p * (cell + gap)
    height = int(60 + p * (cell * 0.72 + gap))
    body = [_text(90 + grid_w / 2, 18, "before", 16, weight="bold"),
            _text(500 + grid_w / 2, 18, "after", 16, weight="bold"),
            _text(400, 18, f"dist.{name}", 17, colour="#c0392b", weight="bold")]
    body += _grid(90, 40, before) + _grid(500, 40, after)
    body.append(_arrow(90 + grid_w + 20, height / 2 + 10, 480, height / 2 + 10))
    return _svg(800, height, body)


# --- data-parallel pictures ---------------------------------------------------------------------

def draw_sampler_shards(n: int = 10, replicas: int = 3) -> str:
    """torch's DistributedSampler on a data set of ``n`` samples (shuffle off, so the picture is
    readable): the indices each rank reads, the padding repeats from the start."""
    from torch.utils.data import DistributedSampler

    shards = [list(DistributedSampler(range(n), num_replicas=replicas, rank=r, shuffle=False)) for r in range(replicas)]
    colours = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc")
    body = [_text(20, 25, f"DistributedSampler(data set of {n}, num_replicas={replicas}, shuffle=False)", 16, anchor="start")]
    owner = {}
    for r, shard in enumerate(shards):
        for k, index in enumerate(shard):
            owner.setdefault(index, r)
    for i in range(n):
        body.append(_box(140 + i * 56, 50, 50, 36, colours[owner[i]], i))
    body.append(_text(125, 68, "data set", 14, anchor="end"))
    seen = set()
    for r, shard in enumerate(shards):
        y = 120 + r * 52
        body.append(_text(125, y + 18, f"rank {r}", 14, anchor="end"))
        for k, index in enumerate(shard):
            padded = index in seen
            seen.add(index)
            body.append(_box(140 + k * 56, y, 50, 36, "#fff" if padded else colours[r], index,
                             colour="#c0392b" if padded else "#222", stroke="#c0392b" if padded else "#444"))
    size = len(shards[0])
    body.append(_text(140 + size * 56 + 10, 120 + 18, f"{size} each = ceil({n}/{replicas})", 14, anchor="start"))
    body.append(_text(140 + size * 56 + 10, 120 + 52 + 18, "red: padding, repeated", 14, anchor="start", colour="#c0392b"))
    body.append(_text(140 + size * 56 + 10, 120 + 104 + 18, "from the start", 14, anchor="start", colour="#c0392b"))
    return _svg(900, 130 + replicas * 52, body)


def draw_buckets(param_bytes: list[int], names: list[str], cap_mb: float | None) -> str:
    """Gradients in the order backward produces them, grouped into DDP's buckets by
    utils.ddp_timing.ddp_bucket_bytes with ``bucket_cap_mb=cap_mb``."""
    from utils.ddp_timing import ddp_bucket_bytes

    buckets = ddp_bucket_bytes(param_bytes, cap_mb)
    total = sum(param_bytes)
    width = 860
    scale = width / total
    cap = "None (DDP's default: 1 MiB first, then 25 MiB)" if cap_mb is None else cap_mb
    body = [_text(20, 22, f"gradients in backward order, bucket_cap_mb={cap}: {len(buckets)} buckets", 16, anchor="start")]
    x = 20
    for name, nbytes in zip(names, param_bytes):
        w = nbytes * scale
        body.append(_box(x, 45, max(w, 2), 40, "#c6dbef"))
        if w > 60:
            body.append(_text(x + w / 2, 65, name, 12))
        x += w
    x = 20
    for k, nbytes in enumerate(buckets):
        w = nbytes * scale
        body.append(_box(x, 100, max(w - 3, 2), 40, BLUES[3 + k % 2], f"bucket {k}" if w > 70 else "", 14, colour="white"))
        if w > 70:
            body.append(_text(x + w / 2, 156, f"{nbytes / 2 ** 20:.2f} MiB", 12))
        x += w
    body.append(_text(20, 185, "each bucket's all-reduce starts as soon as its last gradient is ready", 14,
                      anchor="start", colour="#555"))
    return _svg(900, 200, body)


def draw_strong_weak(workers=(1, 2, 4), batch: int = 64) -> str:
    """Strong scaling keeps the global batch (each worker's share shrinks); weak scaling keeps each
    worker's batch (the global batch grows)."""
    body = [_text(230, 22, f"strong scaling: global batch {batch}", 16, weight="bold"),
            _text(680, 22, f"weak scaling: {batch} per worker", 16, weight="bold")]
    for row, p in enumerate(workers):
        y = 50 + row * 70
        body.append(_text(20, y + 20, f"p = {p}", 15, anchor="start"))
        for w in range(p):
            body.append(_box(80 + w * 300 / p, y, 300 / p - 4, 40, BLUES[1 + w % 4], batch // p))
            body.append(_box(520 + w * 80, y, 76, 40, BLUES[1 + w % 4], batch))
        body.append(_text(880, y + 20, f"global {batch * p}", 13, anchor="end", colour="#555"))
    return _svg(900, 60 + len(workers) * 70, body)


def draw_training_loop() -> str:
    steps = ["next batch", "forward", "loss", "backward", "optimizer.step()", "zero_grad"]
    body = []
    cx, cy, radius = 450, 190, 140
    for k, step in enumerate(steps):
        angle = -math.pi / 2 + 2 * math.pi * k / len(steps)
        x, y = cx + 1.7 * radius * math.cos(angle), cy + radius * math.sin(angle)
        body.append(_box(x - 85, y - 22, 170, 44, BLUES[1 + k % 3], step, 16))
        nxt = -math.pi / 2 + 2 * math.pi * (k + 0.62) / len(steps)
        prev = -math.pi / 2 + 2 * math.pi * (k + 0.38) / len(steps)
        body.append(_arrow(cx + 1.7 * radius * math.cos(prev), cy + radius * math.sin(prev),
                           cx + 1.7 * radius * math.cos(nxt), cy + radius * math.sin(nxt), "#555", 2))
    body.append(_text(cx, cy - 10, "one step", 18, weight="bold"))
    body.append(_text(cx, cy + 16, "an epoch: every batch once", 14, colour="#555"))
    return _svg(900, 380, body)


# --- optimisation pictures ----------------------------------------------------------------------

def draw_sharp_flat() -> str:
    """A training loss with a flat and a sharp minimum of equal depth, and the test loss as the same
    curve shifted a little: the shift costs little at the flat minimum, much at the sharp one
    (the picture of Keskar et al., 2017, figure 1)."""
    def loss(x):
        return 1 - 0.9 * math.exp(-((x + 1.6) / 0.9) ** 2) - 0.9 * math.exp(-((x - 1.8) / 0.18) ** 2)

    def path(shift, colour, dash):
        xs = [-3.5 + 7 * k / 400 for k in range(401)]
        points = " ".join(f"{80 + (x + 3.5) * 105:.1f},{340 - 280 * loss(x - shift):.1f}" for x in xs)
        style = ' stroke-dasharray="8,5"' if dash else ""
        return f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="3"{style}/>'

    shift = 0.25
    body = [path(0, "#3182bd", False), path(shift, "#e6550d", True),
            _text(80 + (-1.6 + 3.5) * 105, 360, "flat minimum", 16), _text(80 + (1.8 + 3.5) * 105, 360, "sharp minimum", 16),
            _text(860, 30, "training loss", 15, anchor="end", colour="#3182bd"),
            _text(860, 52, "test loss (shifted)", 15, anchor="end", colour="#e6550d")]
    for centre in (-1.6, 1.8):
        x = 80 + (centre + 3.5) * 105
        y0, y1 = 340 - 280 * loss(centre), 340 - 280 * loss(centre - shift)
        body.append(f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" stroke="#c0392b" stroke-width="2"/>')
        body.append(_text(x + 10, (y0 + y1) / 2, f"gap {loss(centre - shift) - loss(centre):.2f}", 14, anchor="start",
                          colour="#c0392b"))
    return _svg(900, 380, body)


def draw_hogwild(workers: int = 3) -> str:
    """Workers read the shared weights, compute a gradient on a stale copy and add it in place, with
    no lock: reads and writes of different workers interleave."""
    body = [_text(20, 22, "shared weights w (one copy in shared memory)", 16, anchor="start", weight="bold")]
    body.append(_box(20, 40, 860, 36, "#fee6ce", "w", 16))
    for k in range(workers):
        y = 110 + k * 70
        body.append(_text(20, y + 18, f"worker {k}", 15, anchor="start"))
        offset = 30 * k
        for step in range(3):
            x = 110 + offset + step * 240
            body.append(_box(x, y, 50, 36, BLUES[1], "read", 13))
            body.append(_box(x + 54, y, 120, 36, BLUES[2], "gradient", 13))
            body.append(_box(x + 178, y, 52, 36, "#fdae6b", "add", 13))
            body.append(_arrow(x + 25, y, x + 25, 80, "#3182bd", 1.5, dash=True))
            body.append(_arrow(x + 204, y, x + 204, 80, "#e6550d", 1.5))
    body.append(_text(20, 130 + workers * 70, "no lock: a worker's gradient may come from weights that others have changed since",
                      14, anchor="start", colour="#555"))
    return _svg(900, 150 + workers * 70, body)


def draw_parle(replicas: int = 3) -> str:
    """Parle (Chaudhari et al., 2017) as lab 08 runs it: each replica takes L inner steps on y, pulled
    towards its x (proximal term, gamma), keeping an average z; at a synchronisation one all-reduce
    gives the mean of the z's, and each x is pulled towards its own z (gamma) and that mean (rho)."""
    body = []
    cx, cy = 450, 200
    for a in range(replicas):
        angle = -math.pi / 2 + 2 * math.pi * a / replicas
        x, y = cx + 290 * math.cos(angle), cy + 150 * math.sin(angle)
        body.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="#555" stroke-width="2" '
                    f'stroke-dasharray="3,4"/>')
        body.append(_box(x - 95, y - 28, 190, 56, BLUES[2], f"replica {a}: x, y, z", 16))
        body.append(_text(x, y + 42, "L inner steps on y (pulled to x)", 13, colour="#555"))
    body.append(_box(cx - 95, cy - 28, 190, 56, "#fdae6b", "mean of the z's", 16))   # over the lines
    body.append(_text(cx, 385, "every L steps: one all-reduce of the z's; x pulled to its z (gamma) and to the mean (rho)",
                      14, colour="#555"))
    return _svg(900, 400, body)


def diagrams() -> dict:
    """{file name: function returning SVG text}."""
    made = {f"collective_{name}.svg": (lambda name=name: draw_collective(name)) for name in COLLECTIVES}
    made.update({"sampler_shards.svg": draw_sampler_shards, "strong_weak.svg": draw_strong_weak,
                 "training_loop.svg": draw_training_loop, "sharp_flat.svg": draw_sharp_flat,
                 "hogwild.svg": draw_hogwild, "parle.svg": draw_parle})
    return made

