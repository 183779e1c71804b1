"""What the network adds: gloo's all_reduce between two "hosts" (network namespaces joined by a
veth, tests/netns.py) against two ranks on one host, with the veth shaped to slower rates.

Placements, 2 ranks each, one torch thread per rank:
  - one host: both ranks on host 1 (their traffic stays inside that host's kernel);
  - two hosts: rank 1 on host 2, every byte through the veth;
  - two hosts at RATE (``--rates``, tc's units): each end of the veth limited to RATE by a token
    bucket (tbf). tc's netem, which would add delay, is missing from some kernels (this
    machine's), so only the rate, beta of the alpha-beta model, is shaped.

Each rank runs ``utils.collectives.sweep`` (a barrier before each timed call; the slowest rank's
median), message sizes 4 KiB .. ``--max-bytes``. The placements run one after another, ``--rounds``
times, the order reversed every round so that a slow spell of a shared machine does not hit one
placement only; a placement's time at a size is the median over its rounds. Then
``fit_alpha_beta`` fits the ring's model t = 2(p-1) alpha + 2(p-1)/p n beta per placement. A veth is not a real network: both ends are
in one kernel and no NIC, wire or switch is involved, so "two hosts" measures the extra TCP
path, and the shaped rows show how a slower link moves beta. Needs root, iproute2 and OpenSSH.

    .venv/bin/python benchmarks/bench_multihost.py [--rates 1gbit 100mbit] [--max-bytes N]
        [--repeats R] [--rounds N] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

KIB, MIB = 1024, 1 << 20


def worker(rank: int, master: str, port: int, sizes: list, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from utils.collectives import sweep

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        rows = sweep(dist.all_reduce, sizes, warmup=2, repeats=repeats)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def run_placement(hosts, on: list, sizes: list, repeats: int, folder: Path, port: int) -> list[dict]:
    """Rank r on host ``on[r]``; returns rank 0's rows (the slowest rank's times)."""
    out = folder / f"rows_{port}.json"
    jobs = [hosts[h].popen(sys.executable, __file__, "--worker", str(rank), hosts[0].name, str(port),
                           json.dumps(sizes), str(repeats), str(out), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
            for rank, h in enumerate(on)]
    deadline = time.monotonic() + 900
    logs = []
    for job in jobs:
        try:
            logs.append(job.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in jobs:
                other.kill()
            raise SystemExit("a placement ran past 900 s; nothing was written")
    if any(job.returncode for job in jobs):
        raise SystemExit("a rank failed:\n" + "\n".join(log[-3000:] for log in logs))
    return json.loads(out.read_text())


def _rate_bytes(rate: str) -> float:
    """tc's rate ("1gbit", "100mbit", "500kbit") in bytes per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * factor / 8
    raise ValueError(f"rate {rate!r}: use kbit, mbit or gbit, as tc does")


def size_label(n_bytes: int) -> str:
    return f"{n_bytes // MIB} MiB" if n_bytes >= MIB else f"{n_bytes // KIB} KiB"


def markdown(placements: dict) -> str:
    names = list(placements)
    lines = ["| size | " + " | ".join(f"{name}: time, busbw (MB/s)" for name in names) + " |",
             "|---:|" + "---:|" * len(names)]
    sizes = [row["n_bytes"] for row in placements[names[0]]["rows"]]
    for i, n_bytes in enumerate(sizes):
        cells = [f"{p['rows'][i]['seconds'] * 1e3:.2f} ms, {p['rows'][i]['busbw'] / 1e6:.0f}"
                 for p in placements.values()]
        lines.append(f"| {size_label(n_bytes)} | " + " | ".join(cells) + " |")
    def inverse(beta: float) -> str:
        return f"{1 / beta / 1e6:.0f}" if beta > 0 else "-"

    lines.append("| fit on all sizes: alpha (us), 1/beta (MB/s) | " + " | ".join(
        f"{p['alpha_s'] * 1e6:.0f}, {inverse(p['beta_s_per_byte'])}" for p in placements.values()) + " |")
    lines.append("| fit on 1 MiB and up: 1/beta (MB/s) | " + " | ".join(
        inverse(p["beta_from_1mib_s_per_byte"]) for p in placements.values()) + " |")
    lines.append("| shaped rate (MB/s) | " + " | ".join(
        f"{_rate_bytes(p['rate']) / 1e6:.1f}" if p["rate"] else "-" for p in placements.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", nargs="*", default=["1gbit", "100mbit"], help="veth rates to shape (tc units)")
    parser.add_argument("--max-bytes", type=int, default=16 * MIB)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per size and run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every placement, alternating order")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.max_bytes < 4 * MIB or args.repeats < 1 or args.rounds < 1:
        parser.error("--max-bytes must be >= 4 MiB (beta is fitted on 1 MiB and up), --repeats and --rounds >= 1")

    import machine as machine_info
    import netns
    from utils.collectives import bus_bandwidth, fit_alpha_beta

    reason = netns.unavailable()
    if reason:
        raise SystemExit(f"cannot make two hosts here: {reason}")
    sizes = [4 * KIB * 4 ** k for k in range(12) if 4 * KIB * 4 ** k <= args.max_bytes]
    info = machine_info.describe()
    print(f"Machine: {machine_info.one_line(info)}; load average before: {info['load_average']}", flush=True)
    started = time.perf_counter()
    placements = {}
    with tempfile.TemporaryDirectory(prefix="pdlmh-bench-") as tmp, netns.two_hosts(Path(tmp)) as hosts:
        plan = [("one host", [0, 0], None), ("two hosts", [0, 1], None)] + [
            (f"two hosts, {rate}", [0, 1], rate) for rate in args.rates]
        runs = {name: [] for name, _, _ in plan}
        port = 29500
        for round_ in range(args.rounds):
            for name, on, rate in (plan if round_ % 2 == 0 else plan[::-1]):
                for host in hosts:
                    host.limit_rate(rate)
                runs[name].append(run_placement(hosts, on, sizes, args.repeats, Path(tmp), port))
                port += 1
                print(f"  round {round_ + 1}: {name} done ({time.perf_counter() - started:.0f} s)", flush=True)
        for name, on, rate in plan:
            rows = []
            for i, n_bytes in enumerate(sizes):
                seconds = statistics.median(run[i]["seconds"] for run in runs[name])
                rows.append(dict(n_bytes=n_bytes, seconds=seconds, busbw=bus_bandwidth(n_bytes, seconds, 2),
                                 rounds=[run[i]["seconds"] for run in runs[name]]))
            alpha, beta = fit_alpha_beta(sizes, [r["seconds"] for r in rows], world_size=2)
            # A token bucket lets its first burst through at full speed: only messages well past
            # it show the shaped rate, so beta is also fitted on 1 MiB and up alone.
            big = [r for r in rows if r["n_bytes"] >= MIB]
            _, beta_big = fit_alpha_beta([r["n_bytes"] for r in big], [r["seconds"] for r in big], world_size=2)
            placements[name] = dict(hosts=on, rate=rate, rows=rows, alpha_s=alpha, beta_s_per_byte=beta,
                                    beta_from_1mib_s_per_byte=beta_big)
    info["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    print()
    print(markdown(placements))
    print(f"\nLoad average after: {info['load_average_after']}; total {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(dict(machine=info, date=datetime.date.today().isoformat(),
                                             repeats=args.repeats, rounds=args.rounds, placements=placements,
                                             seconds=time.perf_counter() - started), indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, master, port, sizes, repeats, out = sys.argv[2:8]
        worker(int(rank), master, int(port), json.loads(sizes), int(repeats), out)
    else:
        main()
