"""Shared by every test folder (tests/ mirrors the code: transforms/, accounting/, pipelines/<product>/,
runners/). pytest puts this folder on ``sys.path`` for this file, so the kits beside it
(``release_testkit``, ``audit_kit``, ``aggregate_kit``, ``catalog_kit``, ``sequence_kit``,
``gcs_emulator``) import by name from any folder below."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_DATA = os.path.join(ROOT, "pipelines", "sample_data")


@pytest.fixture
def repo_root() -> str:
    """The repository's root folder (where ``python -m pipelines.NAME`` runs from)."""
    return ROOT


@pytest.fixture
def sample_data() -> str:
    """The bundled sample inputs of every job (``pipelines/sample_data``)."""
    return SAMPLE_DATA
