"""Several machines, on this one: engines and torchrun across two hosts made of network namespaces.

tests/netns.py makes two hosts joined by a veth, each with its own host name, addresses and
sshd. The notebook's side runs on host 1 (tests/multihost_notebook.py, as a learner's kernel on
the first node of a cluster), engines on both. Skipped, with the reason, where namespaces
cannot be made (not root, no iproute2 or OpenSSH: .ci/setup/11-netns.sh installs them).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import netns

pytestmark = pytest.mark.timeout(400)

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "multihost_notebook.py"


@pytest.fixture(scope="module", autouse=True)
def _sweep_leftovers():
    """A run that was killed (no teardown) left namespaces and processes: remove them first."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"several hosts need network namespaces: {reason}")
    netns.sweep()
    yield
    assert netns.sweep() == [], "a test left a namespace behind"


@pytest.fixture
def hosts(tmp_path):
    with netns.two_hosts(tmp_path) as made:
        yield made
    assert netns.namespaces() == [], "namespaces left after the hosts were removed"


def _settings(hosts, **extra) -> str:
    return json.dumps(dict(hosts=[dict(index=h.index, netns=h.netns, name=h.name, address=h.address, link=h.link)
                                  for h in hosts],
                           sshd_pids=[h.sshd.pid for h in hosts], ssh_args=hosts.ssh_args,
                           scp_args=hosts.scp_args, **extra))


def _notebook(hosts, scenario: str, timeout: float = 300, **settings) -> dict:
    """Run the notebook's side on host 1; its report, or a failure with its output and the sshd logs."""
    done = hosts[0].run(sys.executable, str(NOTEBOOK), scenario, _settings(hosts, **settings), timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the notebook printed no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    report = json.loads(lines[-1][len("RESULT "):])
    assert "crash" not in report, f"{report['crash']}\n{done.stderr[-3000:]}\n{hosts.logs()}"
    return report


def test_ssh_engines_on_two_hosts(hosts):
    """cluster.start(4, engines="ssh") with 2 engines per host: ranks, LOCAL_RANK, rendezvous by
    host name, an all-reduce over the veth, and nothing left on either host after stop()."""
    report = _notebook(hosts, "ssh", cluster_timeout=60)
    names = [h.name for h in hosts]
    assert sorted(report["hosts"]) == sorted(names * 2), f"2 engines per host: {report['hosts']}"
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["host"] for r in ranks] == report["hosts"], "each engine runs on the host it reported"
    for r in ranks:
        assert r["local_rank"] == report["hosts"][:r["rank"]].count(r["host"]), f"LOCAL_RANK is its index on its host: {ranks}"
        assert r["sum"] == [10.0] * 3, "1 + 2 + 3 + 4 on every rank"
        # The rendezvous is engine 0's host name, found by each host's /etc/hosts.
        assert r["master"] == report["hosts"][0]
        assert r["master_ip"] == hosts[names.index(r["master"])].address
    assert report["master"].split(":")[0] == report["hosts"][0]
    assert report["all_reduce"] == [4.0 ** 2] * 4, "two all-reduces of ones over 4 ranks"
    # A 4 MiB all-reduce twice between two hosts sends at least 4 MiB through the veth.
    assert report["link_bytes"] > 4 * 2**20, f"only {report['link_bytes']} bytes crossed the veth"
    assert report["left"] == {name: [] for name in names}, f"processes left after cluster.stop(): {report['left']}"
