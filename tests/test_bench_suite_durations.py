"""benchmarks/suite_durations.py: where the suite's time goes, read from pytest's JUnit report."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import suite_durations  # noqa: E402


def test_times_are_summed_per_file_and_the_slowest_tests_come_first(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite name="pytest">'
                      '<testcase classname="tests.test_a" name="one" time="3.0"/>'
                      '<testcase classname="tests.test_a" name="two" time="4.5"/>'
                      '<testcase classname="tests.test_b" name="three[x]" time="10.25"/>'
                      '<testcase classname="tests.test_c" name="skipped"/>'
                      '</testsuite></testsuites>')
    result = suite_durations.summary(report, slowest=2)
    assert result["tests"] == 4 and result["total_s"] == 18
    assert list(result["files_s"].items()) == [("test_b", 10), ("test_a", 8), ("test_c", 0)]
    assert result["slowest_s"] == [["test_b::three[x]", 10.2], ["test_a::two", 4.5]]


def test_every_run_writes_its_slowest_tests_where_a_maintainer_looks(tmp_path):
    """tests/conftest.py writes build/test-durations.json at the end of every run (here: a run of two tests, one
    sleeping), slowest first."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "test_two.py").write_text("import time\ndef test_quick():\n    pass\n"
                                          "def test_sleeps():\n    time.sleep(0.3)\n")
    probe = root / "tests" / "test_zz_durations_probe.py"
    probe.write_text((tmp_path / "test_two.py").read_text())
    durations = root / "build" / "test-durations.json"
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)], cwd=root,
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTEST_ADDOPTS": ""})
        assert done.returncode == 0, done.stdout[-2000:]
        written = json.loads(durations.read_text())
    finally:
        probe.unlink()
    assert written["tests"] == 2 and written["exit_status"] == 0 and written["cores"] == os.cpu_count()
    names = [name for name, _ in written["slowest_s"]]
    assert names == [f"tests/{probe.name}::test_sleeps", f"tests/{probe.name}::test_quick"], names
    assert written["slowest_s"][0][1] >= 0.3 and written["total_s"] >= 0.3
    assert [name for name, _ in written["files_s"]] == [f"tests/{probe.name}"] and written["files_s"][0][1] >= 0.3
