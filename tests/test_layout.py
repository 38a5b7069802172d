"""The layout a maintainer relies on: each concept once, sources cited by public name.

Static checks over the source tree (ast, no imports): fast and independent of Beam.
"""
from __future__ import annotations

import ast
import collections
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("accounting", "transforms", "pipelines", "runners", "benchmarks", "tests")


def _sources():
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as handle:
                        yield os.path.relpath(path, ROOT), handle.read()


def test_sources_are_cited_by_public_name_never_by_a_path_outside_the_repository():
    # Built from parts so this file does not match itself.
    pattern = re.compile("reference" + r"\.md|/work/" + "shared")
    offenders = [path for path, text in _sources() if pattern.search(text)]
    assert offenders == []


def test_transform_and_fn_class_names_are_distinct():
    """Two different PTransforms (or DoFns, CombineFns) never share a name."""
    bases = {"PTransform", "DoFn", "CombineFn"}
    seen = collections.defaultdict(list)
    for path, text in _sources():
        if path.startswith(("tests", "benchmarks")):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and any(
                    (b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)) in bases
                    for b in node.bases):
                seen[node.name].append(path)
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_centralnotice_product_code_lives_beside_its_job():
    """transforms/ holds reusable transforms only; CentralNotice's key columns exist once."""
    assert not os.path.exists(os.path.join(ROOT, "transforms", "impressions_split.py"))
    key_tuple = re.compile(r"\(\s*\"campaign_id\",\s*\"banner_id\",\s*\"country\"")
    repeats = [path for path, text in _sources() if path.startswith(("pipelines", "transforms"))
               and key_tuple.search(text)]
    assert repeats == []


def _dataclass_flags(node: ast.ClassDef):
    """The keyword flags set to True in ``node``'s @dataclass decorator (None: not a dataclass)."""
    for deco in node.decorator_list:
        call = deco if isinstance(deco, ast.Call) else None
        target = call.func if call else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return {k.arg for k in (call.keywords if call else [])
                    if isinstance(k.value, ast.Constant) and k.value.value is True}
    return None


def test_parameter_objects_are_frozen_and_keyword_only():
    """Every dataclass of the product is a frozen, keyword-only value object. Something that
    must change after construction (an accumulator, a session) is a plain class whose docstring
    says what it accumulates, never a mutable dataclass that looks like a parameter object."""
    loose = []
    for path, text in _sources():
        if path.startswith(("tests", "benchmarks")):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                flags = _dataclass_flags(node)
                if flags is not None and not {"frozen", "kw_only"} <= flags:
                    loose.append(f"{path}: {node.name}")
    assert loose == []


#: The one budget type and the one measure type every job shares.
THE_BUDGET, THE_MEASURE = "PrivacyBudget", "Measure"
#: Classes shaped like a budget or a measure (rule below) that are neither, and what each is.
#: Anything else of that shape is a second budget or measure type: hold a PrivacyBudget or a
#: Measure instead, or add it here with the reason it is a different concept.
NEITHER_BUDGET_NOR_MEASURE = {
    "BudgetShare": "a part of a PrivacyBudget, made only by PrivacyBudget.split",
    "EpsDelta": "a guarantee: what composing measures returns",
    "NoiseSpec": "a calibrated noise distribution: the noise a Measure carries",
    "DPTestResult": "the DP tester's verdict on a mechanism",
    "SplitAndMix": "the shuffle-model mechanism's parameters; its job states a Measure",
    "TuningRow": "one row of the CentralNotice tuning report (a candidate, not a release)",
    "NoisedPartial": "wires a Measure's noise to a partial column and its keyed streams",
    "SharedBudget": "a job's session splitting one PrivacyBudget among aggregations",
}


def _fields(node: ast.ClassDef) -> dict[str, str]:
    return {s.target.id: ast.unparse(s.annotation) for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _shape(node: ast.ClassDef) -> str | None:
    """"budget" for a class carrying a budget's own numbers (epsilon with delta or rho) or named
    *Budget; "measure" for one carrying a NoiseSpec, a mechanism with its epsilon, or named
    *Measure; None otherwise. A job's CLI request (*Request) holds flags, not a budget."""
    if node.name.endswith("Request"):
        return None
    fields = _fields(node)
    if node.name.endswith("Measure") or {"mechanism", "epsilon"} <= set(fields) or any(
            "NoiseSpec" in annotation for annotation in fields.values()):
        return "measure"
    if node.name.endswith("Budget") or ("epsilon" in fields and {"delta", "rho"} & set(fields)):
        return "budget"
    return None


def test_one_budget_type_and_one_measure_type():
    shaped = {}
    for path, text in _sources():
        if path.startswith(("tests", "benchmarks")):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _shape(node):
                shaped.setdefault(node.name, []).append((path, _shape(node)))
    assert shaped.get(THE_BUDGET) == [("accounting/budget.py", "budget")]
    assert shaped.get(THE_MEASURE) == [("accounting/measures.py", "measure")]
    others = {name: places for name, places in shaped.items()
              if name not in (THE_BUDGET, THE_MEASURE, *NEITHER_BUDGET_NOR_MEASURE)}
    assert others == {}
    # The exemptions stay honest: each still exists and still has the shape it is exempt from.
    assert sorted(set(NEITHER_BUDGET_NOR_MEASURE) - set(shaped)) == []


def test_the_shape_rule_catches_a_second_budget_or_measure():
    def shape(source):
        return _shape(ast.parse(source).body[0])

    assert shape("class CampaignBudget:\n    total: float") == "budget"
    assert shape("class Split:\n    epsilon: float\n    delta: float = 0.0") == "budget"
    assert shape("class Noisy:\n    name: str\n    spec: Optional[NoiseSpec] = None") == "measure"
    assert shape("class Release:\n    mechanism: str\n    epsilon: float") == "measure"
    assert shape("class ReachFrequencyNoise:\n    budget: PrivacyBudget\n    kind: NoiseKind") is None


#: The only modules outside runners/ that may name Dask: the two transforms that work around its
#: limits (finish_bundle outputs dropped, tagged outputs not kept apart), for every runner alike.
DASK_WORKAROUNDS = ("transforms/batching.py", "transforms/fanout.py")
#: Modules that still name Dask while another change in flight moves the knowledge out (each
#: must still name it: drop the entry when it no longer does). lifecycle.py: its staging leaf and
#: a comment, now the runner profile's (runners.execution), go with the lifecycle's phases.
DASK_PENDING = {"pipelines/release/lifecycle.py": "staging leaf and counters comment"}


def test_runner_knowledge_stays_in_runners():
    """Dask is named only in runners/ and in the transforms that work around its limits:
    transforms take threads and batch sizes from the pipeline's options (filled by the runner
    profile), and how a run goes on a runner is the profile's (runners.execution)."""
    named = {path for path, text in _sources()
             if path.startswith(("accounting", "transforms", "pipelines"))
             and re.search("dask", text, re.IGNORECASE)}
    assert sorted(named - set(DASK_WORKAROUNDS) - set(DASK_PENDING)) == []
    assert sorted(set(DASK_PENDING) - named) == []  # the allowance stays honest


def _imported_modules(text: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_runners_import_no_job():
    """runners/ puts any pipeline on a runner; only its deployment files (runners/deploy/:
    Flex Template metadata, the Airflow DAG) know the jobs under pipelines/."""
    offenders = sorted(path for path, text in _sources()
                       if path.startswith("runners") and not path.startswith("runners/deploy")
                       and any(m.split(".")[0] == "pipelines" for m in _imported_modules(text)))
    assert offenders == []
