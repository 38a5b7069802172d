"""Configuration and list files: one reader that names the file and the line, never its content.

Whatever an operator points a flag or a configuration field at may be the wrong file: a release
key, a credentials file, raw data. Its content must never reach a message (the console, a log, an
operator report, an exception a scheduler records), so every configuration file (JSON) and list
file (one value per line: protected countries, candidate values, output-domain keys) is read
here, and every fault is stated by file, line (and column) and what was expected:

* :func:`read` refuses, by name, a file that is missing or unreadable, a folder, a file that is
  not UTF-8 text, and a release key file in the key store's format (``accounting.keys``: the
  secret as ``2 * KEY_BYTES`` hex digits and a newline, then possibly the release the ledger
  issued it for; local or ``gs://``) -- wherever it is
  given, it is recognised before anything parses it;
* :meth:`TextFile.json` parses JSON; a syntax error names line and column (Python's JSON messages
  are fixed phrases, never the text);
* :meth:`TextFile.lines` yields the numbered values of a list file (``#`` starts a comment; blank
  lines are skipped), and :meth:`TextFile.error` makes the message for a bad one:
  ``FLAG PATH:LINE: what was expected``, without the line.

Data inputs are read by :mod:`pipelines.release.inputs`, whose preflight refuses a key file too
(:func:`is_key_file`).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Optional

from accounting.keys import ISSUED_FOR, KEY_BYTES
from pipelines.release import storage
from pipelines.release.errors import ReleaseRefused

#: A stored release key (keys.ReleaseKey.to_text): exactly its secret in hex with an optional
#: line end, or followed on the next line by the release the ledger issued it for.
_KEY = re.compile(rb"[0-9a-fA-F]{%d}(?:\r?\n?|\r?\n%s.*)" % (2 * KEY_BYTES,
                                                            re.escape(ISSUED_FOR.encode())),
                  re.DOTALL)
#: Enough of a file's first bytes to tell whether it is a key file.
KEY_PROBE_BYTES = 2 * KEY_BYTES + 2 + len(ISSUED_FOR)


class TextFileError(ReleaseRefused):
    """A configuration or list file that cannot be used (exit 2): ``WHAT PATH[:LINE]: REASON``,
    naming the file and line, never the content."""

    def __init__(self, what: str, path: str, reason: str, line: Optional[int] = None):
        self.what, self.path, self.line, self.reason = what, path, line, reason
        self.where = f"{path}:{line}" if line else path
        super().__init__(f"{what} {self.where}: {reason}" if what else f"{self.where}: {reason}")


def is_key_file(head: bytes) -> bool:
    """Whether ``head`` -- a file's first :data:`KEY_PROBE_BYTES` bytes or more -- is a release
    key file: the whole file (a bare secret) or its start (a secret issued for a release)."""
    return bool(_KEY.fullmatch(head))


KEY_FILE_REASON = ("a release key file (the key store's format): a secret is never read as "
                   "input; check the path")


class Line(NamedTuple):
    number: int
    value: str


@dataclass(frozen=True, kw_only=True)
class TextFile:
    """The text of one configuration or list file, and where it came from (for messages)."""

    path: str
    what: str
    text: str = field(repr=False)

    def error(self, number: Optional[int], reason: str) -> TextFileError:
        """A refusal naming this file (and line ``number``); ``reason`` must not quote it."""
        return TextFileError(self.what, self.path, reason, number)

    def json(self) -> Any:
        try:
            return json.loads(self.text)
        except json.JSONDecodeError as err:  # err.msg is a fixed phrase, never the text
            raise TextFileError(self.what, self.path, f"not valid JSON: {err.msg} at line "
                                f"{err.lineno} column {err.colno}") from None

    def lines(self) -> Iterator[Line]:
        """The values of a list file: one per line, ``#`` comments and blank lines skipped."""
        for number, line in enumerate(self.text.splitlines(), 1):
            value = line.split("#", 1)[0].strip()
            if value:
                yield Line(number, value)


def read(path: str, what: str) -> TextFile:
    """The text of a local or ``gs://`` configuration or list file; ``what`` names it in
    messages (a flag such as ``--config``, or a configuration field). Raises
    :class:`TextFileError`."""
    if not isinstance(path, str) or not path:
        raise TextFileError(what, "(none)", "give a file path")
    path = storage.absolute(path)
    if not storage.is_gcs(path) and os.path.isdir(path):
        raise TextFileError(what, path, "a folder, not a file")
    try:
        data = storage.read_bytes(path)
    except OSError as err:
        raise TextFileError(what, path, f"cannot be read ({err.strerror or type(err).__name__})")
    if data is None:
        raise TextFileError(what, path, "does not exist")
    if is_key_file(data[:KEY_PROBE_BYTES]):
        raise TextFileError(what, path, KEY_FILE_REASON)
    if b"\0" in data:
        raise TextFileError(what, path, "a NUL byte: not a text file",
                            data.count(b"\n", 0, data.index(b"\0")) + 1)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TextFileError(what, path, "not UTF-8 text", data.count(b"\n", 0, err.start) + 1) \
            from None
    return TextFile(path=path, what=what, text=text)


#: The longest string value of a JSON configuration a message may quote.
SHOWN_CHARS = 24


def shown(value: Any) -> str:
    """A value of a parsed JSON configuration as a message may show it: numbers, booleans,
    null and short strings (the operator's parameters: ``'UK'``, ``'..'``) quoted; a longer
    string or a container only described (it may be a secret pasted into the wrong field)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= SHOWN_CHARS else f"a string of {len(value)} characters"
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object of {len(value)} field(s)"
    return f"a {type(value).__name__}"
