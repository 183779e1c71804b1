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
