"""Which flags exist, on Beam's options machinery: a job's, the release layer's and Beam's.

A job's flags are a :class:`JobOptions` subclass generated from its frozen request dataclass
(:func:`options_class`): each field of the request and of :class:`~pipelines.release.job.
ReleaseOptions` is a flag in Beam's underscore style, its help from the field's metadata, its
type from the annotation (``bool`` a switch, ``tuple`` a comma-separated list, ``choices`` from
the metadata). ``options_class(job)(argv)`` is a ``PipelineOptions`` like any other and
:meth:`JobOptions.request` turns it into the job's request.

Beam's flags are those of every registered ``PipelineOptions`` class (``PipelineOptions.
__subclasses__()``, as Beam's own ``get_all_options`` collects them), after the runner profiles
registered theirs (:func:`runners.seam.register_options`: the options the profiles fill and
every runner-specific module's); Prism's, Flink's, Spark's and Dataflow's options are in Beam's
core module.

Why the job's options class is not registered with Beam: only :class:`JobOptions` (which adds no
flag) is a direct subclass of ``PipelineOptions``, so no job flag is ever parsed into the runner's
options, and two jobs' flags never meet in one parser (label_dp's ``--labels`` would clash with
Dataflow's ``--labels``: the job's flag wins on the job's command line).

Strict (:func:`check`): every flag of a command line must be known, spelled out exactly. Python's
argparse accepts any unambiguous prefix (``--max_dropped_frac``) unless told not to, and Beam's
``PipelineOptions`` (which does not accept prefixes) drops an unknown flag with a log warning, so
a misspelt ``--max_dropped_fractoin 0.9`` would run with the default. An unknown flag is refused
(exit 2, before anything is read or charged) naming it and the closest known flag (difflib).

One alias per flag: its dashed spelling (``--key-store`` for ``--key_store``, and likewise for
Beam's flags), rewritten to the underscore flag before parsing (:func:`normalise`). An alias is
a fixed spelling, not a prefix. A switch also takes ``--switch=true`` / ``--switch=false``, as
Dataflow Flex Templates pass parameters (runners/deploy/flex_template.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import typing
from typing import Iterable, Optional, Sequence

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from pipelines.release.errors import ReleaseRefused
from pipelines.release.job import ReleaseOptions

class FlagError(ReleaseRefused):
    """A command line that is not the job's (an unknown flag, a bad value, a missing required
    flag): refused before anything is read or charged. ``usage`` is the job's usage line."""

    def __init__(self, message: str, usage: str = ""):
        super().__init__(message)
        self.usage = usage


class Parser(_BeamArgumentParser):
    """Beam's argument parser, without prefixes, raising :class:`FlagError` instead of exiting
    (Beam's own ignores "ambiguous option" errors; argparse's exits the process)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)

    def error(self, message):
        raise FlagError(message, self.format_usage().strip())

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        # Beam's option classes may declare template (ValueProvider) options on the parser.
        group.add_value_provider_argument = functools.partial(
            _BeamArgumentParser.add_value_provider_argument, group)
        return group


# --------------------------------------------------------------------------- the job's flags

def _base_type(annotation):
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    return origin or annotation


def fields(cls):
    """(field, base type) of every field of a request dataclass that is a flag."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "options" or not f.metadata.get("cli", True):
            continue
        yield f, _base_type(hints[f.name])


def _csv(text: str) -> tuple:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_arguments(group, cls) -> list[str]:
    """Flags for every field of ``cls``; returns the flag names."""
    flags = []
    for f, typ in fields(cls):
        flag = f"--{f.name}"
        kwargs = {"help": f.metadata.get("help", ""), "dest": f.name}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if typ is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _csv if typ is tuple else typ
            kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
        if required:
            kwargs["required"] = True
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kwargs["default"] = default
            if typ is not bool and default not in (None, (), ""):
                kwargs["help"] += f" (default: {','.join(default) if typ is tuple else default})"
        group.add_argument(flag, **kwargs)
        flags.append(flag)
    return flags


class JobOptions(PipelineOptions):
    """The flags of one job as Beam pipeline options (the base of :func:`options_class`).

    Adds no flag itself, and it is the only direct subclass of ``PipelineOptions`` here: Beam's
    ``get_all_options`` (which parses every direct subclass's flags) never sees a job's flags."""

    job = None

    def request(self):
        """The job's request: its fields and the release options from these options; every
        other argument of the command line is a Beam pipeline option (``pipeline_args``)."""
        parser = Parser()
        type(self)._add_argparse_args(parser)
        _, rest = parser.parse_known_args(self._flags)
        release = {f.name: getattr(self, f.name) for f, _ in fields(ReleaseOptions)}
        own = {f.name: getattr(self, f.name) for f, _ in fields(self.job.request_type)}
        return self.job.request_type(
            **own, options=ReleaseOptions(**release, pipeline_args=tuple(rest)))


def _class_name(job) -> str:
    return "".join(part.capitalize() for part in job.name.split("_")) + "Options"


@functools.lru_cache(maxsize=None)
def options_class(job) -> type:
    """The job's :class:`JobOptions` subclass: its request's flags, then the release layer's."""

    def _add_argparse_args(cls, parser):
        add_arguments(parser.add_argument_group(job.name), job.request_type)
        add_arguments(parser.add_argument_group("release (every job)"), ReleaseOptions)

    return type(_class_name(job), (JobOptions,), {
        "job": job, "_add_argparse_args": classmethod(_add_argparse_args),
        "__doc__": f"The flags of {job.command} (generated from its request dataclass)."})


def job_flags(job) -> list[str]:
    """The job's own flags, then the release layer's (underscore spellings)."""
    return [f"--{f.name}" for f, _ in fields(job.request_type)] + \
        [f"--{f.name}" for f, _ in fields(ReleaseOptions)]


def switches(job) -> list[str]:
    return [f"--{f.name}" for cls in (job.request_type, ReleaseOptions)
            for f, typ in fields(cls) if typ is bool]


# --------------------------------------------------------------------------- Beam's flags

def beam_options_classes() -> list[type]:
    """Every registered ``PipelineOptions`` class (one per name, as Beam's get_all_options
    takes them), runner-specific ones included (:func:`runners.seam.register_options`)."""
    from runners.seam import register_options

    register_options()
    found = {}
    for cls in PipelineOptions.__subclasses__():
        if cls is not JobOptions:
            found.setdefault(str(cls), cls)
    return list(found.values())


def add_beam_arguments(parser: argparse.ArgumentParser, groups: Optional[dict] = None) -> None:
    """Every registered Beam option, one help group per options class (``groups``: existing
    groups by class, so that they can be created in display order first)."""
    for cls in beam_options_classes():
        group = (groups or {}).get(cls) or beam_group(parser, cls)
        cls._add_argparse_args(group)


def beam_group(parser, cls):
    doc = (cls.__doc__ or "").strip().splitlines()
    return parser.add_argument_group(f"Beam: {cls.__name__}", doc[0] if doc else None)


@functools.lru_cache(maxsize=1)
def beam_flags() -> frozenset:
    parser = Parser()
    add_beam_arguments(parser)
    return frozenset(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


# --------------------------------------------------------------------------- checking

def normalise(argv: Sequence[str], flags: Iterable[str], switches: Sequence[str] = ()) -> list[str]:
    """Dashed spellings of known ``flags`` become the underscore ones; a switch given as
    ``--switch=true`` / ``--switch=false`` becomes ``--switch`` / nothing (any other value is
    left for the parser to refuse)."""
    flags = set(flags)
    known = {f.replace("_", "-"): f for f in flags if f.replace("_", "-") not in flags}
    out = []
    for i, token in enumerate(argv):
        if token == "--":
            out.extend(argv[i:])
            break
        name, eq, value = token.partition("=")
        if name in known:
            name = known[name]
            token = name + (eq + value if eq else "")
        if eq and name in switches and value.lower() in ("true", "false"):
            if value.lower() == "true":
                out.append(name)
            continue
        out.append(token)
    return out


def closest(flag: str, known: Iterable[str]) -> Optional[str]:
    """The known flag nearest to ``flag`` (difflib), comparing underscore spellings."""
    spelled = "--" + flag.lstrip("-").replace("-", "_")
    found = difflib.get_close_matches(spelled, sorted(known), n=1, cutoff=0.6)
    return found[0] if found else None


def refuse_unknown(unknown: Sequence[str], known: Iterable[str], usage: str = "") -> None:
    """Raise :class:`FlagError` for the first argument nobody knows (naming the closest flag)."""
    for token in unknown:
        if token == "--":
            raise FlagError("'--' ends the flags, but every argument of a job is a flag", usage)
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            near = closest(name, known)
            hint = f" (did you mean {near}?)" if near else " (see --help)"
            raise FlagError(f"unknown flag {name}{hint}: no flag of the job, of the release "
                            "layer or of Beam's pipeline options is spelled so; nothing was run",
                            usage)
        raise FlagError(f"unexpected argument {token!r}: every argument is --flag VALUE, "
                        "--flag=VALUE or a --switch", usage)


def check_beam_args(args: Sequence[str]) -> list[str]:
    """Pipeline arguments from the Python API (``ReleaseOptions.pipeline_args``): every flag
    must be one of Beam's registered options, spelled out; returns them with dashed aliases
    rewritten. Raises :class:`FlagError`."""
    args = normalise(list(args), beam_flags())
    parser = Parser()
    add_beam_arguments(parser)
    _, unknown = parser.parse_known_args(args)
    refuse_unknown(unknown, beam_flags())
    return args
