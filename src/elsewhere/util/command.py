"""``python=``: how the other side starts Python, an interpreter or a command line that ends in one.

Every backend that takes ``python=`` reads it here, once, when the cluster is made::

    "/opt/py311/bin/python3"                          one word: an interpreter
    "apptainer exec --nv img.sif python3"             a command line (shlex.split)
    ["podman", "run", "--rm", "-i", "img", "python3"]  a list: argv as it is
    "module load python/3.11 && python3"              shell setup, then the command line
    "OMP_NUM_THREADS=1 python3"                       variables first: run through ``env``

The program's own arguments (``-m elsewhere.worker --job DIR``) are appended after the words.
Each word is a literal: in a job script it is written with :func:`shlex.quote`, on an ssh host
the transport quotes it, here it is an argv entry, so a word means the same everywhere and
``$HOME`` or ``~`` in it are not expanded. What comes before the last ``;`` or ``&&`` outside
quotes is *setup*: shell text run first, exactly as written (``module load``, ``source
venv/bin/activate``, ``eval "$(conda shell.bash hook)"``). After ``&&`` the interpreter starts
only if the setup succeeded, after ``;`` whatever its outcome, as in a shell.

Where the setup runs:

- in a job script: as lines before the run line (``... || exit $?`` for ``&&``), after the
  cluster's ``env_setup``; the run line is ``exec WORDS ARGS`` (:meth:`PythonCommand.shell`);
- everywhere else (local workers, ssh nodes, the interpreter probe): ``bash -lc 'SETUP
  exec "$@"' elsewhere WORDS ARGS`` (:meth:`PythonCommand.argv`), a login shell, as
  environment modules need; without setup the words are run directly, no shell at all.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from .errors import ConfigError

__all__ = ["PythonCommand", "PythonSpec"]

#: What ``python=`` accepts: a string (a command line), a list of words, a path, or a parsed one.
PythonSpec = Union[str, Sequence[str], "os.PathLike[str]", "PythonCommand"]

#: The shell that runs setup outside job scripts (a login shell: ``module`` is defined there).
SETUP_SHELL = ("bash", "-lc")

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class PythonCommand:
    """The command that starts Python on the other side (see the module docstring).

    Attributes:
        words: the command line's words, the interpreter last (``("apptainer", "exec",
            "img.sif", "python3")``); the program's arguments follow them.
        setup: shell lines run before it, each complete (``"module load x || exit $?"``).
        text: the value as the user gave it, for messages.
    """

    words: tuple[str, ...]
    setup: tuple[str, ...] = ()
    text: str = ""

    def __post_init__(self) -> None:
        if not self.words or not self.words[0]:
            raise ConfigError(
                "python= names no command: give an interpreter, e.g. python='python3'"
            )
        for word in self.words:
            if not isinstance(word, str) or "\0" in word:
                raise ConfigError(f"python=: every word is a str without NUL, got {word!r}")
        for line in self.setup:
            if not isinstance(line, str) or "\n" in line:
                raise ConfigError(f"python=: setup lines are single lines, got {line!r}")
        if not self.text:
            object.__setattr__(self, "text", self._shown())

    # -- reading the option ---------------------------------------------------------------
    @classmethod
    def parse(cls, value: PythonSpec, *, option: str = "python") -> PythonCommand:
        """``value`` as a command; :class:`ConfigError` naming ``option`` when it cannot be one.

        A string is split with :func:`shlex.split` after its setup (up to the last ``;`` or
        ``&&`` outside quotes) is taken off; a list or tuple is the words as they are; a path
        object is one word. Leading ``NAME=value`` words are run through ``env``.
        """
        if isinstance(value, PythonCommand):
            return value
        if isinstance(value, os.PathLike):
            value = [os.fspath(value)]
        if isinstance(value, str):
            return cls._parse_text(value, option)
        if isinstance(value, bytes) or not isinstance(value, Sequence):
            raise ConfigError(
                f"{option}= takes a command line (a string, or a list of words), "
                f"not {type(value).__name__}: {value!r}"
            )
        words = list(value)
        if not words:
            raise ConfigError(f"{option}= is an empty list: name an interpreter, e.g. ['python3']")
        bad = [w for w in words if not isinstance(w, str) or "\0" in w]
        if bad:
            raise ConfigError(f"{option}=: every word must be a str without NUL, got {bad[0]!r}")
        if not words[0]:
            raise ConfigError(f"{option}=: the first word is empty: {words!r}")
        return cls(tuple(_with_env(words)), (), shlex.join(words))

    @classmethod
    def _parse_text(cls, text: str, option: str) -> PythonCommand:
        shown = text.strip()
        if not shown:
            raise ConfigError(f"{option}= is empty: name an interpreter, e.g. {option}='python3'")
        if "\n" in shown or "\r" in shown:
            raise ConfigError(
                f"{option}={text!r} spans lines: give one line, setup commands joined "
                "with ; or && (module load python && python3)"
            )
        try:
            shlex.split(shown)
        except ValueError as exc:
            raise ConfigError(
                f"{option}={text!r} cannot be read as a command line: {exc} "
                "(quote as in a shell, or give a list of words)"
            ) from None
        setup: tuple[str, ...] = ()
        rest = shown
        ops = _operators(shown)
        if ops:
            start, end, op = ops[-1]
            if op not in (";", "&&"):
                raise ConfigError(
                    f"{option}={text!r}: the interpreter's command must follow ; or && "
                    f"(not {op!r}); setup commands come before it"
                )
            prefix, rest = shown[:start].strip(), shown[end:]
            if prefix:
                setup = (f"{prefix} || exit $?" if op == "&&" else prefix,)
        words = shlex.split(rest)
        if not words:
            raise ConfigError(
                f"{option}={text!r} ends without a command: name the interpreter after the "
                "setup (module load python && python3)"
            )
        return cls(tuple(_with_env(words)), setup, shown)

    # -- using it -------------------------------------------------------------------------
    @property
    def plain(self) -> bool:
        """One word and no setup: an interpreter by name or path."""
        return len(self.words) == 1 and not self.setup

    @property
    def program(self) -> str:
        """The first word: what must be found on the host (an interpreter or a wrapper)."""
        return self.words[0]

    def argv(self, *args: str) -> list[str]:
        """The argv that runs it with ``args``, no shell in between (a setup gets a login
        bash: ``bash -lc 'SETUP; exec "$@"' elsewhere WORDS ARGS``)."""
        if not self.setup:
            return [*self.words, *args]
        script = "\n".join([*self.setup, 'exec "$@"'])
        return [*SETUP_SHELL, script, "elsewhere", *self.words, *args]

    def shell(self, *args: str) -> str:
        """The words and ``args`` as one shell line, each quoted (the run line of a job
        script, after its setup lines)."""
        return " ".join(shlex.quote(w) for w in (*self.words, *args))

    def with_setup(self, lines: Sequence[str]) -> PythonCommand:
        """This command with ``lines`` run before its own setup (a cluster's ``env_setup``)."""
        lines = [line for line in lines if line.strip()]
        if not lines:
            return self
        return PythonCommand(self.words, (*lines, *self.setup), "; ".join([*lines, self.text]))

    def not_found(self, where: str) -> str:
        """Why it could not start on ``where`` (exit 126 or 127), in words that say what to do."""
        if self.plain:
            return (
                f"no Python interpreter {self.text!r} on {where}: install Python 3 there, "
                "or name the interpreter by its full path (python='/usr/bin/python3')"
            )
        return (
            f"python={self.text!r} could not start on {where}: a command of it was not found "
            f"(is {self.program!r} installed there, and the interpreter after it?)"
        )

    def __str__(self) -> str:
        return self.text

    def _shown(self) -> str:
        return "; ".join([*self.setup, shlex.join(self.words)])


def _with_env(words: list[str]) -> list[str]:
    """``NAME=value ... cmd`` runs as ``env NAME=value ... cmd`` (no shell reads assignments)."""
    return ["env", *words] if _ASSIGNMENT.match(words[0]) else words


def _operators(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, operator)`` of each shell control operator (``; && || | &``) outside
    quotes and parentheses, in order. Redirections (``2>&1``, ``&>``, ``>|``) are not ones."""
    found: list[tuple[int, int, str]] = []
    quote = ""
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and c in ";&|":
            before = text[i - 1] if i else ""
            after = text[i + 1 : i + 2]
            if c in "&|" and (before in "<>" or (c == "&" and after == ">")):
                pass  # a redirection: 2>&1, &>file, >|file
            elif after == c:
                found.append((i, i + 2, c + c))
                i += 2
                continue
            else:
                found.append((i, i + 1, c))
        i += 1
    return found
