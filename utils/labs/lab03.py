"""Figures, tables and findings for labs/03_collectives.ipynb, kept here so the notebook shows the idea
and the result: the before/after drawing of each collective (section 2) and the report of the
all-reduce measurements against the alpha-beta model (section 5). Every sentence a finding prints is
decided by the numbers it is given.
"""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt

from utils import collectives, outcomes

PING_PONG = "ping-pong (rank 0 <-> 1)"
GLOO = "dist.all_reduce (gloo)"
REFERENCE = "ring (utils.collectives)"
YOURS = "ring (yours)"


def draw_collectives(per_rank, names) -> None:
    """One row per collective in ``names``, one column per rank: each rank's values before (top) and
    after (bottom), equal values in equal colours. ``per_rank[r][name]`` is ``(before, after)``, each a
    list of numbers or None (no tensor), as the lab's ``record`` stores them on the engines."""
    width = max(len(v) for pics in per_rank for name in names for v in pics[name] if v is not None)
    fig, axes = plt.subplots(len(names), len(per_rank), squeeze=False,
                             figsize=(min(15, 0.8 + len(per_rank) * max(2.2, 0.38 * width + 0.5)),
                                      1.25 * len(names) + 0.2))
    for row, name in enumerate(names):
        seen = [v for pics in per_rank for vals in pics[name] if vals is not None for v in vals]
        low, high = min(seen), max(seen)
        for r, ax in enumerate(axes[row]):
            for y, vals in zip((1, 0), per_rank[r][name]):
                if vals is None:
                    ax.text(0.05, y, "(no tensor)", va="center", fontsize=8, color="gray")
                for i, v in enumerate(vals or []):
                    shade = 0.1 + 0.6 * (v - low) / (high - low or 1)
                    ax.add_patch(plt.Rectangle((i, y - 0.4), 0.92, 0.8, color=plt.cm.YlGnBu(shade)))
                    ax.text(i + 0.46, y, f"{v:g}", ha="center", va="center", fontsize=8)
            ax.set(xlim=(0, width), ylim=(-0.5, 1.5), xticks=[], yticks=[0, 1])
            ax.set_yticklabels(["after", "before"] if r == 0 else ["", ""], fontsize=8)
            ax.set_title(f"{name}: rank {r}", fontsize=9)
            for side in ax.spines.values():
                side.set_visible(False)
    fig.tight_layout()
    plt.show()


def _rate(beta: float) -> str:
    return f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "unlimited"


def best_of(rounds: list[dict]) -> dict:
    """Per operation and size, the round with the shortest time (the usual benchmark statistic: noise
    only ever adds time). ``rounds`` holds one ``{name: sweep rows}`` per round."""
    return {name: [min((r[name][i] for r in rounds), key=lambda row: row["seconds"])
                   for i in range(len(rounds[0][name]))] for name in rounds[0]}


def spread(rounds: list[dict]) -> dict:
    """Per operation, per size: how much the rounds differ, slowest / fastest - 1 (0.3 = 30%)."""
    return {name: [max(r[name][i]["seconds"] for r in rounds) / min(r[name][i]["seconds"] for r in rounds) - 1
                   for i in range(len(rounds[0][name]))] for name in rounds[0]}


def summarise(rounds: list[dict], world_size: int) -> dict:
    """Print one table per all-reduce (the best of the rounds) and the alpha-beta fits; return them.

    Each round maps a name to ``utils.collectives.sweep``'s rows (the same sizes for each), and must
    hold the ping-pong under ``PING_PONG`` and gloo's all-reduce under ``GLOO``. The link's ``alpha``
    and ``beta`` come from the ping-pong (half a round trip per message); ``predicted`` is the ring
    model with them. ``noise`` is how much the rounds differed, per operation and size; ``per_round`` holds
    every round's time, per operation and size, for the findings' comparisons.
    """
    p = world_size
    measured, noise = best_of(rounds), spread(rounds)
    sizes = [row["n_bytes"] for row in measured[GLOO]]
    all_reduces = [name for name in measured if name != PING_PONG]
    for name in all_reduces:
        print(f"{name}, {p} ranks, best of {len(rounds)} rounds")
        print(f"{'bytes':>10} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13} {'rounds differ':>14}")
        for row, differ in zip(measured[name], noise[name]):
            print(f"{row['n_bytes']:>10} {row['seconds'] * 1e6:>11.1f} {row['algbw'] / 1e9:>13.3f} "
                  f"{row['busbw'] / 1e9:>13.3f} {differ:>13.0%}")
    one_way = [row["seconds"] / 2 for row in measured[PING_PONG]]
    alpha, beta = collectives.fit_alpha_beta(sizes, one_way)
    print(f"\nlink (ping-pong): alpha = {alpha * 1e6:.1f} us per message, 1/beta = {_rate(beta)}")
    gloo_alpha, gloo_beta = collectives.fit_alpha_beta(sizes, [row["seconds"] for row in measured[GLOO]])
    print(f"gloo all_reduce:  t = {gloo_alpha * 1e6:.1f} us + n / ({_rate(gloo_beta)})")
    predicted = [collectives.ring_all_reduce_seconds(n, p, alpha, beta) for n in sizes]
    rings = {}
    for name in all_reduces:
        if name == GLOO:
            continue
        ring_alpha, ring_beta = collectives.fit_alpha_beta(sizes, [row["seconds"] for row in measured[name]],
                                                           world_size=p)
        rings[name] = (ring_alpha, ring_beta)
        print(f"{name}: ring model fitted to it: alpha = {ring_alpha * 1e6:.1f} us, 1/beta = {_rate(ring_beta)}")
    per_round = {name: [[r[name][i]["seconds"] for r in rounds] for i in range(len(sizes))] for name in measured}
    return dict(world_size=p, sizes=sizes, measured=measured, noise=noise, rounds=len(rounds), per_round=per_round,
                all_reduces=all_reduces, alpha=alpha, beta=beta, gloo_alpha=gloo_alpha, gloo_beta=gloo_beta,
                predicted=predicted, rings=rings)


def plot_sweep(report: dict) -> None:
    """Left: time against message size, measured and modelled; right: bus bandwidth against size."""
    sizes, p, alpha, beta = report["sizes"], report["world_size"], report["alpha"], report["beta"]
    measured = report["measured"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colour = {name: f"C{i}" for i, name in enumerate(measured)}
    for name in measured:
        left.plot(sizes, [row["seconds"] for row in measured[name]], "o", color=colour[name],
                  label=f"{name}, measured")
    left.plot(sizes, [report["gloo_alpha"] + report["gloo_beta"] * n for n in sizes], "-", color=colour[GLOO],
              label="gloo all_reduce: alpha + beta n fit")
    left.plot(sizes, report["predicted"], "--", color="k", label="ring predicted from the ping-pong's alpha, beta")
    left.plot(sizes, [2 * (alpha + beta * n) for n in sizes], ":", color=colour[PING_PONG],
              label="ping-pong: 2 (alpha + beta n) fit")
    left.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="seconds",
             title=f"All-reduce on {p} ranks (gloo, this machine)")
    left.legend(fontsize=8)
    for name in report["all_reduces"]:
        right.plot(sizes, [row["busbw"] / 1e9 for row in measured[name]], "o-", color=colour[name], label=name)
    if beta > 0:
        right.axhline(1 / beta / 1e9, color="gray", linestyle=":", label="link bandwidth 1/beta (ping-pong)")
    right.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
              title="busbw = algbw * 2(p-1)/p (nccl-tests)")
    right.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def _kib(n: int) -> str:
    return f"{n // 2 ** 10} KiB" if n < 2 ** 20 else f"{n // 2 ** 20} MiB"


SAID = {"higher": "slower", "lower": "faster", "within the spread": "within the rounds' spread: noise",
        "not judged": "one round each, not judged"}


def _versus(name_a: str, a: list, name_b: str, b: list) -> str:
    """``a`` against ``b`` (seconds, one per round) through ``utils.outcomes.compare``, which records the
    verdict with its numbers: 'slower' or 'faster' only beyond the rounds' spread (half the range of each,
    added), else noise."""
    return SAID[outcomes.compare(name_a, [t * 1e6 for t in a], name_b, [t * 1e6 for t in b], unit=" us")]


def findings(report: dict) -> list[str]:
    """Print what the measurements say, one sentence each (returned too), every verdict decided by the
    numbers: each comparison goes through ``utils.outcomes.compare`` on the rounds' times, so a difference
    counts only beyond the rounds' own spread, and the suite re-derives every verdict from those times."""
    per_round, noise = report["per_round"], report["noise"]
    sizes, p, beta = report["sizes"], report["world_size"], report["beta"]
    mean = {name: [statistics.fmean(times) for times in rows] for name, rows in per_round.items()}
    gloo = mean[GLOO]
    largest = len(sizes) - 1
    worst = max(v for values in noise.values() for v in values)
    lines = []

    def say(line):
        print("-", line)
        lines.append(line)

    say(f"Noise: the {report['rounds']} rounds of each measurement differed by up to {worst:.0%} (column 'rounds "
        f"differ'); below, each comparison uses the rounds' mean, and a difference within the rounds' spread "
        f"is called noise.")
    growth, size_step = gloo[1] / gloo[0], sizes[1] / sizes[0]
    say(f"Small messages: from {_kib(sizes[0])} to {_kib(sizes[1])} ({size_step:g}x the bytes) gloo's all-reduce "
        f"time grew {growth:.2f}x (its rounds differed by {max(noise[GLOO][:2]):.0%} there): "
        + ("far less than the bytes, so latency, not bytes, sets the time there."
           if growth < size_step / 2 else "about as much as the bytes, so the bytes already matter there."))
    model_small = report["predicted"][0]
    verdict = _versus(f"gloo at {_kib(sizes[0])}", per_round[GLOO][0], "the ring model", [model_small])
    say(f"At {_kib(sizes[0])} gloo took {gloo[0] * 1e6:.0f} us, {gloo[0] / model_small:.1f}x the ring model's "
        f"{model_small * 1e6:.0f} us (2(p-1) = {2 * (p - 1)} latencies of the ping-pong's alpha): "
        + {"slower": "slower than the model.", "faster": "faster than the model."}.get(
            verdict, f"as the model says, {verdict}."))
    for name in report["all_reduces"]:
        busbw = report["measured"][name][largest]["busbw"]
        share = f", {busbw * beta:.0%} of the link's 1/beta = {_rate(beta)}" if beta > 0 else ""
        say(f"{name}: busbw at {_kib(sizes[largest])} = {busbw / 1e9:.2f} GB/s (best round){share}.")
    for i in (0, largest):
        for name in report["all_reduces"]:
            if name == GLOO:
                continue
            verdict = _versus(f"{name} at {_kib(sizes[i])}", per_round[name][i], "gloo", per_round[GLOO][i])
            say(f"At {_kib(sizes[i])} {name} took {mean[name][i] / gloo[i]:.2f}x gloo's time: {verdict}.")
    if YOURS in per_round:
        mine, reference = mean[YOURS][largest], mean[REFERENCE][largest]
        pieces = -(-(sizes[largest] // p) // collectives.SEGMENT_BYTES)
        verdict = _versus(f"the reference ring at {_kib(sizes[largest])}", per_round[REFERENCE][largest],
                          "yours", per_round[YOURS][largest])
        say(f"At {_kib(sizes[largest])} the pipelined reference ring took {reference / mine:.2f}x the time of "
            f"yours: {verdict}. Each chunk is {pieces} piece(s) of at most {_kib(collectives.SEGMENT_BYTES)} here"
            + (", so there was nothing to pipeline: a difference comes from elsewhere (the reference "
               "reuses its buffers and posts the next step's receives early)." if pieces == 1 else
               ": the pieces of a chunk can overlap each other's transfers and additions."))
    return lines


def print_findings(report: dict) -> None:
    findings(report)
