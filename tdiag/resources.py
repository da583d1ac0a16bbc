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
from collections.abc import Callable
from pathlib import Path

from .errors import Diagnostic, TdiagError, did_you_mean

CORPUS = "shakespeare_gut.txt.gz"


def package_folder(name: str) -> Path:
    """The package-data folder `name`: inside the installed package, else at the repository root."""
    packaged = Path(str(importlib.resources.files("tdiag") / name))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / name


def grammar_text() -> str:
    """The text of the `.td` grammar (tdiag.lark)."""
    return (package_folder("grammar") / "tdiag.lark").read_text(encoding="utf-8")


def designs_folder() -> Path:
    """The folder of the bundled designs; `extends` in them finds its base as a sibling file."""
    return package_folder("designs")


def bundled_designs() -> list[str]:
    """The names of the bundled designs (`fish`, `mgk`, ...), sorted."""
    return sorted(path.stem for path in designs_folder().glob("*.td"))


def design_file(path: str | Path) -> Path:
    """The file a design argument names: an existing path as given, else a bundled design by
    name (`fish` or `fish.td`). Anything else is an error that lists the bundled names."""
    if not str(path):  # Path("") would be the current folder
        raise missing_design(path)
    return _bundled_or_given(path, designs_folder(), ".td", bundled_designs)


def _bundled_or_given(path: str | Path, folder: Path, suffix: str, names: Callable[[], list[str]]) -> Path:
    """An existing file or a path as given, else the bundled file of that name in `folder`."""
    given = Path(path)
    if not str(path) or os.path.isfile(given) or given.parent != Path("."):  # os.path: False for any bad path
        return given
    name = given.name.removesuffix(suffix)
    return folder / f"{name}{suffix}" if name in names() else given


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
    return _bundled_or_given(path, designs_folder() / "spaces", ".tds", bundled_spaces)


NAMES_IN_A_HINT = 10  # a hint lists at most this many bundled names; more are pointed to, not printed


def missing_space(path: str | Path) -> TdiagError:
    """The error for a space argument that is neither a file nor a bundled space."""
    return _missing("space", path, ".tds", bundled_spaces())


def missing_design(path: str | Path) -> TdiagError:
    """The error for a design argument that is neither a file nor a bundled design."""
    return _missing("design", path, ".td", bundled_designs())


def _missing(kind: str, path: str | Path, suffix: str, names: list[str]) -> TdiagError:
    """`no such {kind} file`; a bare name is told the bundled names (and the closest one), a
    path is one line."""
    message = f"no such {kind} file '{path}'"
    if Path(path).parent != Path("."):  # a path, not a name that could be a bundled one's
        return TdiagError(Diagnostic(message))
    guess = did_you_mean(Path(path).name.removesuffix(suffix), names)
    listing = f"bundled {kind}s: {', '.join(names)}"
    if len(names) > NAMES_IN_A_HINT:
        listing = f"`tdiag list` names the {len(names)} bundled {kind}s"
    return TdiagError(Diagnostic(message, hint=f"{guess} {listing}" if guess else listing))


def default_corpus() -> Path:
    """The character corpus `tdiag train` uses without `--data` (gzipped UTF-8 text, ~2 MB)."""
    return Path(str(importlib.resources.files("tdiag") / "data" / CORPUS))
