"""Where the grammar, the bundled designs and the default corpus live, installed or not.

An installed package (wheel, sdist) carries them as package data: `tdiag/grammar/tdiag.lark`,
`tdiag/designs/*.td` and `tdiag/data/shakespeare_gut.txt.gz`. In the repository the grammar and
designs are kept once, at the root (`grammar/`, `designs/`), where the README, the tests and users
name them; pyproject.toml maps those two folders into the package when a wheel is built. A
source checkout or an editable install therefore finds them beside the package instead.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from .errors import Diagnostic, TdiagError, did_you_mean

CORPUS = "shakespeare_gut.txt.gz"


def _folder(name: str) -> Path:
    """The package-data folder `name`: inside the installed package, else at the repository root."""
    packaged = Path(str(importlib.resources.files("tdiag") / name))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / name


def grammar_text() -> str:
    """The text of the `.td` grammar (tdiag.lark)."""
    return (_folder("grammar") / "tdiag.lark").read_text(encoding="utf-8")


def designs_folder() -> Path:
    """The folder of the bundled designs; `extends` in them finds its base as a sibling file."""
    return _folder("designs")


def bundled_designs() -> list[str]:
    """The names of the bundled designs (`fish`, `mgk`, ...), sorted."""
    return sorted(path.stem for path in designs_folder().glob("*.td"))


def design_file(path: str | Path) -> Path:
    """The file a design argument names: an existing path as given, else a bundled design by
    name (`fish` or `fish.td`). Anything else is an error that lists the bundled names."""
    if not str(path):  # Path("") would be the current folder
        raise missing_design(path)
    given = Path(path)
    if os.path.isfile(given) or given.parent != Path("."):  # os.path: False, not an error, for any bad path
        return given
    name = given.name.removesuffix(".td")
    if name in bundled_designs():
        return designs_folder() / f"{name}.td"
    return given


def shown_path(file: str | Path) -> str:
    """A design file as generated code and reports name it, never by an absolute path into the
    installation: `designs/mhsa.td` for a bundled design (wherever the package is installed), a
    path under the current folder relative to it, any other path as given."""
    given = Path(file)
    try:
        resolved = given.resolve()
        inside = resolved.relative_to(designs_folder().resolve())
    except (OSError, ValueError, RuntimeError):
        inside = None
    if inside is not None:
        return f"designs/{inside.as_posix()}"
    if given.is_absolute():
        try:
            return resolved.relative_to(Path.cwd().resolve()).as_posix()
        except (OSError, ValueError):
            return str(file)
    return str(file)


def bundled_spaces() -> list[str]:
    """The names of the bundled design spaces (`tuformer`, `fish`, `mgk`), sorted."""
    return sorted(path.stem for path in (designs_folder() / "spaces").glob("*.tds"))


def space_file(path: str | Path) -> Path:
    """The file a space argument names: an existing path as given, else a bundled space by name
    (`tuformer` or `tuformer.tds`); anything else is left as given (its reader says it is missing)."""
    given = Path(path)
    if not str(path) or os.path.isfile(given) or given.parent != Path("."):
        return given
    name = given.name.removesuffix(".tds")
    if name in bundled_spaces():
        return designs_folder() / "spaces" / f"{name}.tds"
    return given


def missing_space(path: str | Path) -> TdiagError:
    """The error for a space argument that is neither a file nor a bundled space; a bare name is
    told the bundled names (and the closest one)."""
    message = f"no such space file '{path}'"
    if Path(path).parent != Path("."):
        return TdiagError(Diagnostic(message))
    names = bundled_spaces()
    guess = did_you_mean(Path(path).name.removesuffix(".tds"), names)
    listing = f"bundled spaces: {', '.join(names)}"
    return TdiagError(Diagnostic(message, hint=f"{guess} {listing}" if guess else listing))


def missing_design(path: str | Path) -> TdiagError:
    """The error for a design argument that is neither a file nor a bundled design; a bare name
    is told the bundled names (and the closest one), a path is one line."""
    message = f"no such design file '{path}'"
    if Path(path).parent != Path("."):  # a path, not a name that could be a bundled design's
        return TdiagError(Diagnostic(message))
    names = bundled_designs()
    guess = did_you_mean(Path(path).name.removesuffix(".td"), names)
    listing = f"bundled designs: {', '.join(names)}"
    return TdiagError(Diagnostic(message, hint=f"{guess} {listing}" if guess else listing))


def default_corpus() -> Path:
    """The character corpus `tdiag train` uses without `--data` (gzipped UTF-8 text, ~2 MB)."""
    return Path(str(importlib.resources.files("tdiag") / "data" / CORPUS))
