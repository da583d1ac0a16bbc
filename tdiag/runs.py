"""A `tdiag train` run folder: held by one run at a time, and written so that no failure loses or
alters what it holds. Every file is replaced whole (temporary file, fsync, rename) or not at all;
the folder's lock is held from the claim until the run ends, and the operating system releases it
when the process dies, so a killed run never leaves its folder locked. The folder keeps a copy of
the design's files, so a run resumes from anywhere even after the original file moved."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import Diagnostic, TdiagError
from .files import read_regular, replace_atomically
from .resources import bundled_designs, design_file
from .train_config import TrainConfig, config_problems

RUN_FILES = ("config.json", "checkpoint.pt", "log.csv", "log.jsonl", "loss.png", "sample.txt", "summary.json")
LOCK_FILE = "run.lock"  # never removed: removing a lock file another process has open would split the lock
DESIGN_FOLDER = "design"  # the copies of the design's files (the design and each base it extends)


# ---- the lock ----------------------------------------------------------------------------------


_HELD: dict[Path, tuple[int, int]] = {}  # this process's locked folders (resolved) -> (descriptor, claims)


class FolderLock:
    """An exclusive flock on the folder's lock file. Re-entrant within a process (--compare holds
    every design's folder while each run claims its own), released by `release` or on exit."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.key = folder.resolve()
        descriptor, claims = _HELD.get(self.key) or (_acquire(folder), 0)
        _HELD[self.key] = (descriptor, claims + 1)
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        descriptor, claims = _HELD.pop(self.key)
        if claims > 1:
            _HELD[self.key] = (descriptor, claims - 1)
        else:
            os.close(descriptor)  # closing the last descriptor drops the flock

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _acquire(folder: Path) -> int:
    """The descriptor of the folder's lock file, flocked by this process and naming it."""
    import fcntl

    try:
        descriptor = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _cannot_lock(folder, error) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 32).decode(errors="replace").strip()
        os.close(descriptor)
        by = f" (process {holder})" if holder.isdigit() else ""
        raise TdiagError(
            Diagnostic(
                f"run folder '{folder}' is in use: another tdiag train holds it{by}",
                hint="wait for that run to end (or stop it), or choose another --out",
            )
        ) from None
    except OSError as error:  # a file system without locks
        os.close(descriptor)
        raise _cannot_lock(folder, error) from None
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
    except OSError as error:
        os.close(descriptor)
        raise _cannot_lock(folder, error) from None
    return descriptor


def _cannot_lock(folder: Path, error: OSError) -> TdiagError:
    return TdiagError(Diagnostic(f"cannot lock run folder '{folder}': {error.strerror or error}"))


def claim_folder(folder: Path, *, resume: bool, overwrite: bool) -> FolderLock:
    """Lock the run folder (created if needed) for this run. A folder that holds a run is continued
    (`resume`) or replaced (`overwrite`), never silently overwritten; replacing it first removes
    the old run's files, so a run killed before its first checkpoint cannot leave one design's
    config beside another's checkpoint. The caller releases the returned lock when the run ends."""
    if folder.exists() and not folder.is_dir():
        raise TdiagError(Diagnostic(f"run folder '{folder}' is a file", hint="choose another --out"))
    if resume and not folder.is_dir():
        raise TdiagError(Diagnostic(f"no run to resume in '{folder}' (no such folder)"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot create run folder '{folder}': {error.strerror or error}")) from None
    lock = FolderLock(folder)
    try:
        _clear(folder, resume=resume, overwrite=overwrite)
    except BaseException:
        lock.release()
        raise
    return lock


def _clear(folder: Path, *, resume: bool, overwrite: bool) -> None:
    held = [name for name in (*RUN_FILES, DESIGN_FOLDER) if (folder / name).exists()]
    if resume or not held:
        return
    if not overwrite:
        raise TdiagError(
            Diagnostic(
                f"run folder '{folder}' already holds a run ({', '.join(held)})",
                hint=f"continue it with: tdiag train --resume {folder}; or choose another --out, "
                "or pass --overwrite to replace it",
            )
        )
    try:
        for name in held:
            if name == DESIGN_FOLDER:
                _remove_design_copy(folder / name)
            else:
                (folder / name).unlink()
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot replace the run in '{folder}': {error.strerror or error}")) from None


def _remove_design_copy(copy: Path) -> None:
    """The copied .td files and their folder; anything else a user put there is left in place."""
    for file in copy.glob("*.td"):
        file.unlink()
    if not any(copy.iterdir()):
        copy.rmdir()


# ---- writing -----------------------------------------------------------------------------------


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over
    `path`: a killed process or a full disk leaves the old file or the new one, never half, and
    no temporary file."""
    replace_atomically(path, data)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A file-system error while writing `path` becomes one line naming the path and the cause."""
    try:
        yield
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot write '{path}': {error.strerror or error}")) from None


# ---- the design's copy -------------------------------------------------------------------------


def recorded_design(given: str) -> str:
    """How a run records its design: a bundled design by name, any other file by its absolute path
    (so the record means the same from every working folder)."""
    path = Path(given)
    if not path.is_file() and path.parent == Path(".") and path.name.removesuffix(".td") in bundled_designs():
        return path.name.removesuffix(".td")
    return str(path.resolve())


def copy_design(design: str, folder: Path) -> dict:
    """Copy the design's files (the design and each base it extends) into the run folder; the
    record (the design's file name and every copy's sha256) goes into config.json."""
    from .graph.merge import design_chain

    files = design_chain(str(design_file(design)))
    target = folder / DESIGN_FOLDER
    record: dict = {"file": files[0].name, "sha256": {}}
    with writing(target):
        target.mkdir(exist_ok=True)
        for file in files:
            data = file.read_bytes()
            write_atomically(target / file.name, data)
            record["sha256"][file.name] = hashlib.sha256(data).hexdigest()
    return record


def design_copy(folder: Path, record: dict) -> Path:
    """The run's copy of its design, each file checked against the sha256 recorded when the run
    started: an edited or missing copy is an error, never a silently different design."""
    target = folder / DESIGN_FOLDER
    for name, digest in record["sha256"].items():
        path = target / name
        try:
            data = read_regular(str(path))  # a FIFO put in its place would block a plain read
        except OSError as error:
            raise TdiagError(
                Diagnostic(f"cannot read the run's design copy '{path}': {error.strerror or error}")
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise TdiagError(
                Diagnostic(
                    f"the run's design copy '{path}' differs from the design the run was started with",
                    hint="restore the file, or start a new run with the edited design",
                )
            )
    return target / record["file"]


def _copy_problems(record: object) -> list[str]:
    if not isinstance(record, dict) or set(record) != {"file", "sha256"}:
        return ["design_copy is not {file, sha256}"]
    digests = record["sha256"]
    if not isinstance(digests, dict) or record["file"] not in digests:
        return ["design_copy.sha256 does not list design_copy.file"]
    for name, digest in digests.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            return [f"design_copy names {name!r}, not a file name"]
        if not _is_sha256(digest):
            return [f"design_copy.sha256[{name!r}] is not a sha256"]
    return []


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


# ---- config.json ---------------------------------------------------------------------------------


def config_text(config: TrainConfig, copy: dict, data_sha256: str, summary: dict) -> bytes:
    """config.json: the settings, the design copy's record, the data's sha256 and the model's summary."""
    import dataclasses

    record = {"design_copy": copy, "data_sha256": data_sha256, "summary": summary}
    return json.dumps(dataclasses.asdict(config) | record, indent=2).encode()


def read_run_config(folder: Path) -> tuple[TrainConfig, dict, str]:
    """The settings, the design copy's record and the data's sha256 in a run folder's config.json, held to the rules
    of the flags; a missing, broken or edited-into-nonsense file is a one-line error naming the
    file and the field (and is left as it was)."""
    path = folder / "config.json"
    if not path.is_file():
        raise TdiagError(Diagnostic(f"'{folder}' is not a run folder (no config.json)"))
    hint = "the run cannot be resumed from this config"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise TdiagError(Diagnostic(f"cannot read '{path}': {reason}", hint=hint)) from None
    if not isinstance(saved, dict):
        raise TdiagError(Diagnostic(f"'{path}' is not a run config (expected a JSON object)", hint=hint))
    saved.pop("summary", None)
    copy, data_sha256 = saved.pop("design_copy", None), saved.pop("data_sha256", None)
    problems = config_problems(saved, complete=True) + (_copy_problems(copy) if copy is not None else [])
    if copy is None:
        problems.append("missing setting 'design_copy' (a run folder written before tdiag kept design copies)")
    if not _is_sha256(data_sha256):
        problems.append(f"data_sha256 is {data_sha256!r}, not a sha256")
    if problems:
        raise TdiagError(Diagnostic(f"'{path}' is not a valid run config: {'; '.join(problems)}", hint=hint))
    config = TrainConfig(**saved)
    config.out = str(folder)
    return config, copy, data_sha256
