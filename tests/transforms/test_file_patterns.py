"""One normalisation of file patterns, without Beam: relative and ``~`` paths made absolute (Beam's
file systems need them), URLs as given, anything but a non-empty string refused."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transforms.file_patterns import normalize_glob


def test_local_patterns_become_absolute_and_urls_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert normalize_glob("rows-*.parquet") == os.path.join(str(tmp_path), "rows-*.parquet")
    assert normalize_glob("~/in/*.csv") == os.path.join(str(tmp_path), "home", "in", "*.csv")
    assert normalize_glob("a/../b.csv") == os.path.join(str(tmp_path), "b.csv")
    assert normalize_glob("gs://bucket/x-*.csv") == "gs://bucket/x-*.csv"
    for bad in ("", None, 3):
        with pytest.raises(TypeError, match="non-empty string"):
            normalize_glob(bad)


def test_it_imports_no_beam():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys, transforms.file_patterns\nprint('apache_beam' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), check=True)
    assert done.stdout.strip() == "False"
