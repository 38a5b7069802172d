"""Verification: how the toolkit checks its own privacy claims, imported by tests and audits only.

* :mod:`accounting.verification.dp_tester` -- a statistical tester of a sampled mechanism's
  (epsilon, delta) claim on neighbouring datasets;
* :mod:`accounting.verification.audit` -- the neighbouring-pair audit framework: a job run on a
  dataset and on adversarial neighbours of it with one release key, checking that only declared
  noisy values differ.

The registry of every job's audit is ``tests/audit_kit.py`` (it imports the jobs, which
``accounting`` never does); ``tests/accounting/verification/`` runs it.
"""
