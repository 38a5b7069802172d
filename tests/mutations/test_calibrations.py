"""The calibration inventory (calibrations.py) against the tree and the mutation suite: every
calibration parameter has a mutant the runner knows, and a file that calibrates without an
entry (a new mechanism, a new parameter) fails here until it has one."""
from __future__ import annotations

import os
import re

import run
from calibrations import CALIBRATIONS, NOT_CALIBRATIONS
from mutants import MUTANTS

ROOT = run.ROOT

#: What calibrating looks like in the source: a calibrate call, a sensitivity, a keep or flip
#: probability on the 2^-32 grid, a binomial share, a Polya table.
CALIBRATING = re.compile(r"\bcalibrate(?:_zcdp)?\(|\b[a-z_]+_sensitivity\(|l[12]_sensitivity=|"
                         r"flip_probability\(|threshold_floor\(|binomial_share_for\(|polya_table\(")

#: Parameters without a mutant yet (calibrations.py says why for each): closing one or opening
#: a new one changes this list on purpose.
GAPS = {("transforms/sketches/dp.py", "reach sensitivity (one register)")}


def calibrating_files() -> set[str]:
    found = set()
    for top in ("transforms", "pipelines"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    lines = [line for line in handle if not line.lstrip().startswith(("def ", "#"))]
                if CALIBRATING.search("".join(lines)):
                    found.add(os.path.relpath(path, ROOT))
    return found


def test_every_entry_names_a_mutant_of_its_own_file_that_the_runner_knows():
    known = {m.name: m for m in run.MUTANTS}
    assert {m.name for m in MUTANTS} == set(known)
    for entry in CALIBRATIONS:
        assert os.path.isfile(os.path.join(ROOT, entry.file)), entry
        if entry.mutant is None:
            assert entry.gap, f"{entry}: a parameter without a mutant must say why"
            continue
        assert not entry.gap, entry
        assert entry.mutant in known, f"{entry}: no mutant {entry.mutant!r} in mutants.py"
        assert known[entry.mutant].file == entry.file, (entry, known[entry.mutant].file)
    assert len({(e.file, e.parameter) for e in CALIBRATIONS}) == len(CALIBRATIONS)
    mutants = [e.mutant for e in CALIBRATIONS if e.mutant]
    assert len(mutants) == len(set(mutants)), "one mutant per parameter"


def test_the_gaps_are_the_listed_ones():
    assert {(e.file, e.parameter) for e in CALIBRATIONS if e.mutant is None} == GAPS


def test_every_calibrating_file_has_an_entry_or_a_reason():
    inventoried = {e.file for e in CALIBRATIONS}
    scanned = calibrating_files()
    missing = sorted(scanned - inventoried - set(NOT_CALIBRATIONS))
    assert not missing, f"files that calibrate without an inventory entry: {missing}"
    stale = sorted(set(NOT_CALIBRATIONS) - scanned)
    assert not stale, f"NOT_CALIBRATIONS names files that no longer calibrate: {stale}"
    assert not set(NOT_CALIBRATIONS) & inventoried


def test_the_scan_sees_a_new_calibration():
    """The pattern finds the forms a new mechanism would use, and not a definition alone."""
    assert CALIBRATING.search("spec = calibrate(kind, epsilon=e, l1_sensitivity=s)")
    assert CALIBRATING.search("sens = count_sensitivity(bounds)")
    assert not CALIBRATING.search("total = np.clip(values, 0, 1)")
