"""The layout a maintainer relies on: each concept once, sources cited by public name.

Static checks over the source tree (ast, no imports: fast and independent of Beam), and one
that reads the audit registry (tests/audit_kit.py) to find every job's audit.
"""
from __future__ import annotations

import ast
import collections
import functools
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("accounting", "transforms", "pipelines", "runners", "benchmarks", "tests")


@functools.lru_cache(maxsize=None)
def _sources() -> tuple:
    """(path, text) of every Python file of the project's packages."""
    return tuple(_read_sources())


@functools.lru_cache(maxsize=None)
def _parsed(path: str) -> ast.Module:
    return ast.parse(dict(_sources())[path])


def _read_sources():
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
    "Stated": "an EpsDelta and the accountant its figure comes from (guarantee.stated)",
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


def test_runner_knowledge_stays_in_runners():
    """Dask is named only in runners/ and in the transforms that work around its limits:
    transforms take threads and batch sizes from the pipeline's options (filled by the runner
    profile), and how a run goes on a runner is the profile's (runners.seam, runners.execution)."""
    named = {path for path, text in _sources()
             if path.startswith(("accounting", "transforms", "pipelines"))
             and re.search("dask", text, re.IGNORECASE)}
    assert sorted(named - set(DASK_WORKAROUNDS)) == []


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


def _all_imports(text: str) -> set[str]:
    """Every module ``text`` imports, at any depth (inside functions too); ``from a import b``
    gives ``a.b`` as well as ``a``, since ``b`` may be a module of package ``a``."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _import_graph(texts: dict) -> dict:
    """{module: the modules of ``texts`` it imports} for ``texts`` = {path: source} of one
    package's modules (the package's own ``__init__`` left out: importing a submodule imports
    it, so every module would seem to loop through it)."""
    names = {path[:-3].replace("/", "."): text for path, text in texts.items()
             if not path.endswith("__init__.py")}
    return {name: {m for m in _all_imports(text) if m in names and m != name}
            for name, text in names.items()}


def _import_loops(graph: dict) -> list:
    """The modules of ``graph`` that import themselves through other modules."""
    def reaches(start, goal, seen):
        return any(m == goal or (m not in seen and reaches(m, goal, seen | {m}))
                   for m in graph.get(start, ()))

    return sorted(name for name in graph if reaches(name, name, {name}))


#: What the release layer may import of runners/: the seam, and the interface's value types.
RELEASE_RUNNER_MODULES = {"runners.seam", "runners.execution"}


def test_runners_import_in_no_loop_and_the_release_layer_asks_the_seam():
    """runners/execution.py is the interface every profile's execution implements: it imports
    nothing of runners/ (the profiles import it); no module of runners/ imports another that
    imports it back, however indirectly (imports inside functions count). The release layer
    imports of runners/ only the seam (runners.seam) and the interface (runners.execution),
    never a profile or a specific runner's module (Dataflow's, Dask's, Prism's)."""
    graph = _import_graph({path: text for path, text in _sources()
                           if path.startswith("runners/") and path.count("/") == 1})
    assert graph["runners.execution"] == set()
    assert _import_loops(graph) == []
    asked = {path: sorted(m for m in _all_imports(text) if m.split(".")[0] == "runners"
                          and m != "runners" and m not in RELEASE_RUNNER_MODULES
                          and m.rsplit(".", 1)[0] not in RELEASE_RUNNER_MODULES)
             for path, text in _sources() if path.startswith("pipelines/release/")}
    assert {path: found for path, found in asked.items() if found} == {}


def test_the_runner_rule_catches_a_loop():
    graph = _import_graph({"runners/a.py": "def f():\n    from runners.b import g\n",
                           "runners/b.py": "from runners import c\n",
                           "runners/c.py": "import runners.a\n",
                           "runners/d.py": "from runners import a\n"})
    assert _import_loops(graph) == ["runners.a", "runners.b", "runners.c"]


def _shadowed(script_names, packages) -> list:
    """The script names (benchmarks/NAME.py) that are also the name of an importable package."""
    return sorted(set(script_names) & set(packages))


def test_no_benchmark_shadows_a_package():
    """A benchmark runs as a script (``python benchmarks/NAME.py``), so benchmarks/ comes first
    on ``sys.path``: a benchmark named like one of the project's packages, a standard-library
    module or an installed distribution's module would be imported in its place
    (``benchmarks/runners.py`` made ``import runners`` fail with a circular import)."""
    import importlib.metadata
    import sys

    scripts = [n[:-3] for n in os.listdir(os.path.join(ROOT, "benchmarks")) if n.endswith(".py")]
    packages = {n for n in os.listdir(ROOT) if os.path.exists(os.path.join(ROOT, n, "__init__.py"))}
    packages |= set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
    assert {"runners", "transforms", "json", "numpy"} <= packages
    assert _shadowed(scripts, packages) == []
    assert _shadowed(["runners", "aggregate"], packages) == ["runners"]  # the rule bites


#: Documents and scripts that cite source files, besides the Python sources.
DOCUMENTS = (".md", ".sh", ".example")


def _documents():
    """(path, text) of every Python file, document and script of the repository."""
    yield from _sources()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules")]
        for name in files:
            if name.endswith(DOCUMENTS):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    yield os.path.relpath(path, ROOT), handle.read()


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None) for b in node.bases}


def _classes():
    """(path, ClassDef) of every class of the product (not tests, not benchmarks)."""
    for path, _ in _sources():
        if not path.startswith(("tests", "benchmarks")):
            for node in ast.walk(_parsed(path)):
                if isinstance(node, ast.ClassDef):
                    yield path, node


def _calls(path: str, attribute: str, owners: set[str]) -> bool:
    """Whether ``path`` calls ``<owner>.<attribute>(...)`` for an owner named in ``owners``."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == attribute and isinstance(node.func.value, ast.Name)
               and node.func.value.id in owners for node in ast.walk(_parsed(path)))


#: The one home of each concept that once existed twice (issue 31); a second definition fails.
ONE_HOME = {
    ("class", "RandomSource"): "transforms/randomness.py",
    ("class", "SystemRandomness"): "transforms/randomness.py",
    ("class", "RecordDraws"): "transforms/randomness.py",
    ("class", "TextFile"): "pipelines/release/textfiles.py",  # configuration and list files
    ("def", "conform"): "transforms/released_files.py",
    ("def", "encode"): "transforms/released_files.py",
    ("def", "read_bytes"): "pipelines/release/storage.py",  # local and gs:// reads, the catalog's too
}


#: Names a concept had before it found its one home: defined nowhere any more.
RETIRED = {
    ("def", "read_text"): "configuration and list files are read by pipelines.release.textfiles "
                          "(it names file and line, never the content, and refuses key files), "
                          "on storage's read_bytes for local and gs:// paths",
}


def test_each_concept_has_one_home():
    homes = collections.defaultdict(list)
    for path, _ in _sources():
        if path.startswith(("tests", "benchmarks")):
            continue
        for node in _parsed(path).body:  # module level: methods named encode are coders
            kind = "class" if isinstance(node, ast.ClassDef) else \
                "def" if isinstance(node, ast.FunctionDef) else None
            name = getattr(node, "name", "").lstrip("_")
            if (kind, name) in ONE_HOME or (kind, name) in RETIRED:
                homes[(kind, name)].append(path)
    assert {k: v for k, v in homes.items() if k in RETIRED} == {}
    homes = {k: v for k, v in homes.items() if k not in RETIRED}
    assert {k: v for k, v in homes.items() if v != [ONE_HOME[k]]} == {}
    assert sorted(set(ONE_HOME) - set(homes)) == []


def test_every_client_randomness_source_implements_the_one_interface():
    """A class drawing a client's random words (``words`` with ``word_at`` or ``records``) is a
    transforms.randomness.RandomSource: LDP and Masked LARk clients take one interface."""
    classes = dict((node.name, node) for _, node in _classes())

    def derives(name, seen=()):
        node = classes.get(name)
        return name == "RandomSource" or (node is not None and name not in seen and any(
            derives(base, (*seen, name)) for base in _base_names(node)))

    sources = [f"{path}: {node.name}" for path, node in _classes()
               if {"words"} <= {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
               and {"word_at", "records"} & {f.name for f in node.body if isinstance(f, ast.FunctionDef)}]
    assert sources and [s for s in sources if not derives(s.split(": ")[1])] == []


#: Product modules that write Parquet or Arrow CSV files which are not releases (inputs).
NOT_RELEASED_FILES = {
    "transforms/ldp/sample_data.py": "writes the sample clients' report files (job inputs)",
    "pipelines/centralnotice/data.py": "writes synthetic impressions and clicks (job inputs)",
}


#: The one Parquet writer under every Parquet file of the project (page checksums on); it
#: encodes no released file itself.
PARQUET_WRITER = "transforms/parquet_files.py"


def test_released_files_have_one_encoder():
    """Released Parquet and CSV files are encoded by transforms/released_files.py only (the
    library sink and the jobs alike): the same release gives the same bytes."""
    writers = {path for path, _ in _sources() if not path.startswith(("tests", "benchmarks"))
               and (_calls(path, "write_table", {"pq", "parquet", "parquet_files"})
                    or _calls(path, "write_csv", {"pacsv", "csv"}))}
    assert sorted(writers - set(NOT_RELEASED_FILES) - {PARQUET_WRITER}) == \
        ["transforms/released_files.py"]
    assert sorted(set(NOT_RELEASED_FILES) - writers) == []


def test_parquet_is_written_and_read_through_the_checksummed_module():
    """Every Parquet file the product writes carries page checksums and every page it reads is
    verified (transforms/parquet_files.py): pyarrow.parquet's writer and readers are called
    there only."""
    direct = sorted(path for path, _ in _sources()
                    if not path.startswith("tests") and path != PARQUET_WRITER
                    and any(_calls(path, name, {"pq", "parquet"}) for name in
                            ("write_table", "ParquetWriter", "ParquetFile", "read_table")))
    assert direct == []


def test_every_beam_class_is_used():
    """A PTransform, DoFn or CombineFn of the product that nothing applies, tests or documents
    is dead code (like the ARA reader nobody used): use it or delete it."""
    words = collections.Counter(w for _, text in _documents() for w in re.findall(r"\w+", text))
    dead = [f"{path}: {node.name}" for path, node in _classes()
            if _base_names(node) & {"PTransform", "DoFn", "CombineFn"} and words[node.name] <= 1]
    assert dead == []


#: Thin wrappers kept on purpose, and why.
NOT_ALIASES = {
    "pipelines/release/storage.py:is_gcs": "the release layer asks its one file-system facade, "
                                           "storage, whether a path is on GCS",
}


def _parameters(node: ast.FunctionDef) -> list[tuple[str, str | None]]:
    """(name, default as source or None) of each parameter, positional ones first."""
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    return [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(positional, defaults)] + \
        [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]


def _forwards_to(wrapper: ast.FunctionDef, call: ast.Call, wrapped: ast.FunctionDef) -> bool:
    """Whether ``call`` (the wrapper's only statement) hands each of its parameters, unchanged,
    to a parameter of ``wrapped`` with the same default, every other parameter of ``wrapped``
    keeping its own default: the wrapper is another name for ``wrapped``."""
    own = dict(_parameters(wrapper))
    theirs = _parameters(wrapped)
    positional = len(wrapped.args.posonlyargs + wrapped.args.args)
    mapped = {}
    for i, arg in enumerate(call.args):
        if not isinstance(arg, ast.Name) or arg.id not in own or i >= positional:
            return False
        mapped[theirs[i][0]] = own[arg.id]
    for keyword in call.keywords:
        if not isinstance(keyword.value, ast.Name) or keyword.value.id not in own:
            return False
        mapped[keyword.arg] = own[keyword.value.id]
    if len(mapped) != len(own):
        return False
    return all((name in mapped and mapped[name] == default) or (name not in mapped and default is not None)
               for name, default in theirs)


def _module_path(module: str) -> str | None:
    """The repository file of a dotted module name, if the repository ships it."""
    base = module.replace(".", "/")
    for candidate in (base + ".py", base + "/__init__.py"):
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def _wrapped_function(path: str, call: ast.Call) -> ast.FunctionDef | None:
    """The module-level function of the repository that ``call`` (in ``path``) calls by name
    (``g(...)``, defined in the module or imported from another) or through a module
    (``module.g(...)``), if any."""
    tree = _parsed(path)
    names = {}  # local name -> (module, attribute or None)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = (alias.name, None)
    module, name = path[:-3].replace("/", "."), None
    if isinstance(call.func, ast.Name):
        module, name = names.get(call.func.id, (module, call.func.id))
        if _module_path(f"{module}.{name}"):  # ``from package import function`` of a module?
            return None
    elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id in names:
        imported, attribute = names[call.func.value.id]
        module, name = (f"{imported}.{attribute}" if attribute else imported), call.func.attr
    target = _module_path(module) if name else None
    if target is None or target not in dict(_sources()):
        return None
    return next((node for node in _parsed(target).body
                 if isinstance(node, ast.FunctionDef) and node.name == name), None)


def test_no_function_is_an_alias_of_another():
    """A module-level function whose body only returns another function of the project called
    with its own parameters, unchanged and with the same defaults, is an alias: one concept,
    two names (like ``build_options`` for ``pipeline_options_for``). Call the function itself."""
    aliases = []
    for path, _ in _sources():
        if path.startswith(("tests", "benchmarks")):
            continue
        for node in _parsed(path).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if len(body) != 1 or not isinstance(body[0], ast.Return) \
                    or not isinstance(body[0].value, ast.Call):
                continue
            wrapped = _wrapped_function(path, body[0].value)
            if wrapped is not None and wrapped is not node and _forwards_to(node, body[0].value, wrapped):
                aliases.append(f"{path}:{node.name}")
    assert sorted(set(aliases) - set(NOT_ALIASES)) == []
    assert sorted(set(NOT_ALIASES) - set(aliases)) == []


def test_every_job_has_a_registered_audit():
    """Every job under pipelines/ (a module with a top-level ``JOB``) has a neighbouring-pair
    audit in the registry tests/accounting/verification/test_audits.py runs (tests/audit_kit.py's docstring: a few
    lines), read from the registry itself."""
    import importlib

    from audit_kit import REGISTRY

    jobs = []
    for path, _ in _sources():
        if path.startswith("pipelines/") and any(
                isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "JOB" for t in node.targets)
                for node in _parsed(path).body):
            jobs.append(importlib.import_module(path[:-3].replace("/", ".")).JOB.name)
    # (pipelines/release/job.py defines the Job base class, no ``JOB``.)
    assert len(jobs) >= 10
    missing = sorted(j for j in jobs if not any(a == j or a.startswith(j + "/") for a in REGISTRY))
    assert missing == [], f"jobs without a neighbouring-pair audit: {missing}"


_CITED_PATH = re.compile(r"(?<![\w/.-])((?:accounting|transforms|pipelines|runners|benchmarks|tests)"
                         r"/[\w./-]*\.(?:py|md|sh|example|lock|json|csv|txt))(?![\w/])")
_CITED_MODULE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):`~?((?:accounting|transforms|"
                           r"pipelines|runners|benchmarks)(?:\.\w+)+)")
#: Documents owned by a change in flight that still cite files another change moved (each must
#: still cite them: drop the entry when it no longer does). None now: the READMEs cite
#: runners/deploy/ since the guides were merged with the runner seam.
CITATIONS_PENDING: dict[str, set] = {}


def _module_exists(parts: list[str]) -> int:
    """How many leading parts of a dotted name are a module or package of the repository."""
    for i in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:i])
        if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
            return i
    return 0


def test_cited_source_files_exist():
    """A file or module cited in a docstring, comment or document (``transforms/x.py``,
    ``:mod:`transforms.x```) is one the repository ships: a citation of a moved, renamed or
    deleted file misleads the reader."""
    broken = {}
    for path, text in _documents():
        if path == os.path.join("tests", "test_layout.py"):  # its examples of broken citations
            continue
        for match in _CITED_PATH.finditer(text):
            if not os.path.exists(os.path.join(ROOT, match.group(1))):
                broken.setdefault(path, set()).add(match.group(1))
        for match in _CITED_MODULE.finditer(text):
            parts = match.group(1).split(".")
            if _module_exists(parts) < max(1, len(parts) - 2):  # module[.Class[.member]]
                broken.setdefault(path, set()).add(match.group(1))
    pending = {path: cited & CITATIONS_PENDING.get(path, set()) for path, cited in broken.items()}
    assert {path: cited - CITATIONS_PENDING.get(path, set()) for path, cited in broken.items()
            if cited - CITATIONS_PENDING.get(path, set())} == {}
    assert {path: cited for path, cited in CITATIONS_PENDING.items() if pending.get(path) != cited} == {}


def test_the_citation_rule_catches_a_missing_file():
    assert _CITED_PATH.search("see transforms/aggregate_old.py, step 2").group(1) == \
        "transforms/aggregate_old.py"
    assert not os.path.exists(os.path.join(ROOT, "transforms/aggregate_old.py"))
    assert _CITED_MODULE.search(":class:`~transforms.aggregate.DPAggregate`").group(1) == \
        "transforms.aggregate.DPAggregate"
    assert _module_exists("transforms.aggregate.DPAggregate".split(".")) == 2
    assert _module_exists("transforms.aggregate_old.DPAggregate".split(".")) == 1


# --------------------------------------------------------------------------- the layout (issue 38)

#: pipelines/: the release layer, one package per product, and the bundled sample inputs.
PRODUCTS = ("centralnotice", "ara", "ldp", "masked_lark", "reach_frequency", "catalog")
PIPELINES_LAYOUT = {"__init__.py", "release", "sample_data", *PRODUCTS}


def test_pipelines_is_one_package_per_product():
    """No flat job modules: what a product is (its jobs, configuration, data and tuning) is one
    folder under pipelines/, beside the release layer they all stand on."""
    entries = {e for e in os.listdir(os.path.join(ROOT, "pipelines")) if e != "__pycache__"}
    assert entries == PIPELINES_LAYOUT
    for package in ("release", *PRODUCTS):
        assert os.path.isfile(os.path.join(ROOT, "pipelines", package, "__init__.py")), package


def test_job_products_import_only_themselves_and_the_release_layer():
    """A product's modules import the release layer and their own package, never another
    product: what two products share belongs to pipelines/release/ (or transforms/)."""
    crossing = {}
    for path, text in _sources():
        parts = path.split("/")
        if parts[0] == "pipelines" and len(parts) > 2 and parts[1] in PRODUCTS and parts[1] != "catalog":
            others = {m for m in _imported_modules(text) if m.split(".")[0] == "pipelines"
                      and m.split(".")[1:2] not in ([parts[1]], ["release"])}
            if others:
                crossing[path] = sorted(others)
    assert crossing == {}


def test_every_job_runs_as_its_documented_module():
    """``python -m pipelines.PRODUCT`` runs a product package's ``job`` module (its
    ``__main__.py``); every other job module is run by its own dotted name."""
    from runners.deploy.flex_template import JOBS

    assert len(JOBS) >= 10
    for name, command in JOBS.items():
        path = command.replace(".", "/")
        if os.path.isdir(os.path.join(ROOT, path)):
            main = open(os.path.join(ROOT, path, "__main__.py"), encoding="utf-8").read()
            assert f"from {command}.job import main" in main, command
        else:
            assert os.path.isfile(os.path.join(ROOT, path + ".py")), command


def test_verification_is_its_own_place_imported_only_by_tests():
    """The DP tester and the neighbouring-pair audit framework live in accounting/verification/;
    no production module imports them (they check the product; they are not part of it)."""
    folder = os.path.join(ROOT, "accounting", "verification")
    assert {"audit.py", "dp_tester.py", "__init__.py"} <= set(os.listdir(folder))
    importers = sorted(path for path, text in _sources()
                       if path.split("/")[0] in ("accounting", "transforms", "pipelines", "runners")
                       and not path.startswith("accounting/verification/")
                       and any(m.startswith("accounting.verification") for m in _imported_modules(text)))
    assert importers == []


#: The most files the top of tests/ holds: cross-cutting tests, the kits and conftest.py.
TOP_OF_TESTS = 20
#: Production modules whose tests do not sit in the mirrored folder (tests/<its folder>/), each
#: with the test files that cover it and why they live there.
COVERED_ELSEWHERE = {
    "accounting/gcs.py": (("tests/accounting/ledger/test_ledger.py",),
                          "gs:// ledgers and key stores, on the GCS emulator"),
    "accounting/validation.py": (("tests/accounting/test_budget.py", "tests/accounting/test_calibration.py"),
                                 "the shared parameter checks, through budgets and calibration"),
    "accounting/ledger/digest.py": (("tests/accounting/ledger/test_ledger.py",),
                                    "record digests, through every ledger read and write"),
    "accounting/ledger/machine.py": (("tests/pipelines/release/test_release_layer.py",
                                      "tests/accounting/ledger/test_ledger.py"),
                                     "the reservation state machine, driven by the release layer"),
    "accounting/ledger/sealing.py": (("tests/accounting/ledger/test_ledger.py",),
                                     "the MAC'd head, through every sealed write and tamper case"),
    "transforms/ara/hierarchy.py": (("tests/pipelines/ara/test_ara_optimize.py",),
                                    "key hierarchies, chosen by the ARA optimiser"),
    "transforms/batching.py": (("tests/runners/test_dask_runner.py",),
                               "batches that survive runners dropping finish_bundle outputs"),
    "transforms/fanout.py": (("tests/runners/test_dask_runner.py",),
                             "tagged outputs kept apart on every runner"),
    "transforms/vectors.py": (("tests/transforms/test_aggregate.py",),
                              "vector partials, through DPAggregate's vector metrics"),
    "transforms/noise/mechanisms.py": (("tests/transforms/test_aggregate.py",
                                        "tests/accounting/verification/test_dp_tester.py"),
                                       "mechanisms applied to partials, and their DP claims"),
    "transforms/noise/streams.py": (("tests/transforms/noise/test_noise.py",
                                     "tests/transforms/test_release_sharding.py"),
                                    "keyed streams, through every sampler and sharded release"),
    "pipelines/ara/event_tuning.py": (("tests/test_module_help.py",),
                                      "a tuning report command; its --help runs in the help test"),
    "pipelines/catalog/operator.py": (("tests/pipelines/catalog/test_catalog.py",),
                                      "the operator view, built by every catalog run"),
    "pipelines/ldp/collection.py": (("tests/pipelines/ldp/test_ldp_jobs.py",),
                                    "what the LDP jobs share, through the jobs"),
    "pipelines/release/job.py": (("tests/pipelines/release/test_release_layer.py",
                                  "tests/transforms/test_released_files.py"),
                                 "the Job interface, through toy jobs and the library sink"),
    "pipelines/release/outputs.py": (("tests/transforms/test_released_files.py",
                                      "tests/transforms/test_parquet_files.py"),
                                     "released files, written by the library sink too"),
    "runners/beam_import.py": (("tests/test_module_help.py",),
                               "Beam imported without its warning, by every command's --help"),
    "runners/demo_release.py": (("tests/runners/test_runners.py",),
                                "the demo release each runner runs"),
    "runners/fetch.py": (("tests/runners/test_runners.py",),
                         "job-server jars fetched for Flink and Spark"),
    "runners/deploy/airflow_dag.py": (("tests/runners/test_runners.py",),
                                      "the DAG, built under the installed Airflow (make test-airflow)"),
    "runners/deploy/schedule.py": (("tests/runners/test_schedule.py",
                                    "tests/runners/test_runners.py"),
                                   "what a scheduled run releases, for cron and the DAG"),
    "runners/deploy/flex_launcher.py": (("tests/runners/test_flex_template.py",),
                                        "the Flex Template launcher, beside the template"),
    "runners/deploy/flex_template.py": (("tests/runners/test_flex_template.py",),
                                        "the Flex Template metadata"),
}


def _test_imports() -> dict[str, set]:
    """{test module: the modules it imports, and ``module.name`` for each ``from module import
    name``} (a name may be a submodule), from each file's one parse."""
    found = {}
    for path, _ in _sources():
        if path.startswith("tests/") and os.path.basename(path).startswith("test_"):
            names = set()
            for node in ast.walk(_parsed(path)):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module)
                    names.update(f"{node.module}.{alias.name}" for alias in node.names)
            found[path] = names
    return found


def test_tests_mirror_the_code():
    """tests/ has the code's folders (tests/transforms/, tests/accounting/, tests/pipelines/<product>/,
    tests/runners/): every production module is imported by a test module in its mirrored folder
    (``transforms/ldp/pem.py`` by one of ``tests/transforms/ldp/``), or is named above with the
    tests that cover it elsewhere and why."""
    top = [e for e in os.listdir(os.path.join(ROOT, "tests"))
           if os.path.isfile(os.path.join(ROOT, "tests", e))]
    assert len(top) <= TOP_OF_TESTS, sorted(top)
    imports = _test_imports()
    uncovered, mirrored_too = [], []
    for path, _ in _sources():
        if path.split("/")[0] not in ("accounting", "transforms", "pipelines", "runners") \
                or os.path.basename(path) in ("__init__.py", "__main__.py"):
            continue
        module = path[:-3].replace("/", ".")
        folder = os.path.join("tests", os.path.dirname(path))
        mirrored = any(os.path.dirname(t) == folder and module in i for t, i in imports.items())
        if not mirrored and path not in COVERED_ELSEWHERE:
            uncovered.append(path)
        if mirrored and path in COVERED_ELSEWHERE:
            mirrored_too.append(path)
    assert uncovered == []
    assert mirrored_too == []  # the exemption is stale: its tests moved to the mirrored folder
    for path, (tests, why) in COVERED_ELSEWHERE.items():
        assert os.path.isfile(os.path.join(ROOT, path)), path
        assert why and all(os.path.isfile(os.path.join(ROOT, t)) for t in tests), path


#: What the catalog may read releases with: the release layer's Beam-free layout, storage,
#: configuration reader and schema check, and CentralNotice's configuration parser (the public schedule).
CATALOG_READS = {"pipelines.release.layout", "pipelines.release.storage",
                 "pipelines.release.textfiles", "pipelines.release.config_schema",
                 "pipelines.centralnotice.config",
                 "transforms.error_columns"}  # the error columns' naming rule (numpy, no Beam)
#: Libraries the catalog renders and checks with (none imports Beam).
CATALOG_LIBRARIES = {"jinja2", "markupsafe", "jsonschema"}


def _import_targets(text: str) -> set[str]:
    """Every module an import statement names, at any depth of the file (a function's imports
    too), ``from package import module`` as the module."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.add(dotted if _module_file(dotted) else node.module)
    return found


def _module_file(dotted: str):
    path = os.path.join(ROOT, *dotted.split("."))
    return path + ".py" if os.path.isfile(path + ".py") else (
        path if os.path.isdir(path) else None)


def test_the_catalog_stands_on_its_own():
    """The catalog (pipelines/catalog/) reads published files, the ledger and configuration, and
    imports no Beam by construction: its modules import the standard library, accounting/
    (not its verification), their own package, CATALOG_READS and CATALOG_LIBRARIES only --
    at any depth, a function's imports too -- and ``pipelines/__init__.py`` treats it as any
    command (no exemption)."""
    wrong = {}
    for path, text in _sources():
        if not path.startswith("pipelines/catalog/"):
            continue
        bad = sorted(m for m in _import_targets(text)
                     if m.split(".")[0] not in sys.stdlib_module_names | CATALOG_LIBRARIES
                     and not (m.split(".")[0] == "accounting"
                              and not m.startswith("accounting.verification"))
                     and not m.startswith("pipelines.catalog") and m not in CATALOG_READS)
        if bad:
            wrong[path] = bad
    assert wrong == {}
    entry = open(os.path.join(ROOT, "pipelines", "__init__.py"), encoding="utf-8").read()
    assert "LAZY_BEAM" not in entry and "pipelines.catalog" not in entry


def test_the_catalog_runs_without_beam():
    """What the static rule promises, run: every catalog module and what it reads with, a
    CentralNotice configuration parsed for its schedule, and ``python -m pipelines.catalog``
    itself leave Beam unimported."""
    modules = sorted({f"pipelines.catalog.{name[:-3]}" for name in os.listdir(
        os.path.join(ROOT, "pipelines", "catalog")) if name.endswith(".py")
        and name != "__main__.py"} | CATALOG_READS)
    config = os.path.join(ROOT, "pipelines", "sample_data", "centralnotice", "campaigns.json")
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            "from pipelines.catalog import schedule\n"
            f"kind, config = schedule.load_config({config!r})\n"
            "assert kind == 'centralnotice' and schedule.centralnotice_slots(config)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))")
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
    cli = subprocess.run([sys.executable, "-X", "importtime", "-m", "pipelines.catalog", "--help"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout.startswith("usage:"), cli.stderr[-2000:]
    assert [line for line in cli.stderr.splitlines() if "apache_beam" in line] == []
    assert "import time:" in cli.stderr  # the check above read a real import trace
