"""pyproject.toml and environment.yml describe the same environment."""
from __future__ import annotations

import re

import yaml

from notebook_runner import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _normalise(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement.replace(" ", "").lower())


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_lists = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_lists) == 1, "environment.yml needs exactly one pip: section"
    in_env = {_normalise(r) for r in pip_lists[0] if not r.startswith("-e")}
    in_project = {_normalise(r) for r in project["dependencies"]}
    assert in_env == in_project, (f"only in environment.yml: {sorted(in_env - in_project)}; "
                                  f"only in pyproject.toml: {sorted(in_project - in_env)}")
    assert "-e ." in pip_lists[0], "environment.yml should install the course library itself (-e .)"
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python and python[0].replace(" ", "") == "python" + project["requires-python"].replace(" ", "")
