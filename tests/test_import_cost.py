"""A job's start-up pays only for what it uses: transforms load no dp_accounting, no scipy.

dp_accounting takes about a second to import; only numerical accounting (PLD / RDP accountants in
accounting.composition, the ledger's accountants) needs it, and imports it on use. scipy (~0.15 s
even for scipy.special alone) is imported by the functions that need it (Gaussian calibration,
noise CDFs, selection thresholds), so a Laplace aggregate on a public keyset never loads it.
"""
from __future__ import annotations

import subprocess
import sys

from runners.harness import REPO_ROOT, project_env


def test_dp_aggregate_import_loads_neither_dp_accounting_nor_scipy():
    code = ("import sys, transforms.aggregate, accounting.composition, accounting.sensitivity\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dp_accounting'"
            " or m.split('.')[0] == 'scipy'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=project_env(),
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_accountants_still_import_dp_accounting_on_use():
    from accounting import composition, sensitivity

    relation = composition.NeighboringRelation.REPLACE_ONE
    assert sensitivity.Neighbouring.SUBSTITUTE.dp_accounting is relation
    import dp_accounting
    accountant = composition.pld_accountant(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0))
    assert 0.9 < accountant.get_epsilon(1e-6) <= 1.01  # Laplace, scale 1: epsilon 1
