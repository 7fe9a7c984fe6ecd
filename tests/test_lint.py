"""The linter and the type checker, as the README's test command runs them, so that `pytest` alone also fails
on their findings (rules: pyproject.toml's [tool.ruff] and [tool.mypy]). Skipped, with the reason, where the
tool is not installed (`pip install -e '.[test]'` installs both)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it is in setup.cfg's test extra: pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def test_ruff_finds_nothing():
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    done = _run("mypy")  # the packages and options: pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr
