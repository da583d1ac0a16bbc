"""Every file a command reads or writes goes through here. A source (`.td`, `.tds`) is read only
when it is a regular file of at most MAX_SOURCE_BYTES, without ever blocking (a FIFO or a device
is refused before it is opened). An output is written to a temporary file in its own folder and
renamed over the target, so a failure (a full disk, a file too large) leaves the previous file as
it was and no half-written one; it is never written over a file the command read, nor over
anything that is not a regular file. Each failure is one TdiagError naming the path and the cause."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

from .errors import SOURCES, Diagnostic, Span, TdiagError

MAX_SOURCE_BYTES = 4 * 2**20  # 4 MiB: the largest bundled design is 2.3 KB, a 10,000-line design about 0.3 MB

SUFFIXES = {"design": ".td", "design space": ".tds"}
_NODE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


_READ: ContextVar[list[str] | None] = ContextVar("tdiag_sources_read", default=None)


@contextlib.contextmanager
def one_command() -> Iterator[list[str]]:
    """The scope of one command: every source read inside it is an input of every output written
    inside it, so no output goes over a design, a base it extends or a space the command read."""
    read: list[str] = []
    token = _READ.set(read)
    try:
        yield read
    finally:
        _READ.reset(token)


def sources_read() -> list[str]:
    """The sources read so far in this command (none outside `one_command`)."""
    return list(_READ.get() or [])


class OutputRefusedError(TdiagError):
    """An output a command will not write: one of its inputs, a folder, a device, a place that
    cannot hold a file. A usage mistake, found before any work where the command can."""


def check_path(path: str | Path, kind: str = "design") -> None:
    """Refuse a path no file can have (one holding a NUL byte, which the OS would not take)."""
    if "\0" in str(path):
        raise TdiagError(Diagnostic(f"no {kind} file can be named {str(path)!r}: a file name holds no NUL byte"))


def _cause(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else str(error)


def node_kind(path: str | Path) -> str | None:
    """What `path` is when it is there but not a regular file ("a folder", "a FIFO (named pipe)",
    ...), without opening it; None for a regular file or nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _node_kind(mode)


def _node_kind(mode: int) -> str:
    return next((kind for is_kind, kind in _NODE_KINDS if is_kind(mode)), "not a regular file")


# ---- reading ----------------------------------------------------------------------------------


def read_source(path: str | Path, kind: str = "design", missing: Callable[[str], TdiagError] | None = None) -> str:
    """The UTF-8 text of the `kind` file at `path` (design, design space). A missing file raises
    `missing(path)` when given; anything but a regular file, a file over MAX_SOURCE_BYTES or a
    byte that is not UTF-8 (positioned) is a TdiagError naming the path."""
    file = str(path)
    check_path(file, kind)
    read = _READ.get()
    if read is not None:
        read.append(file)
    try:
        raw = read_regular(file, kind)
    except FileNotFoundError:
        if missing is not None:
            raise missing(file) from None
        raise TdiagError(Diagnostic(f"no such {kind} file '{file}'")) from None
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot read '{file}': {_cause(error)}")) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(file, raw, error.start, kind) from None


def read_regular(file: str, kind: str = "design") -> bytes:
    """The bytes of a regular file, stat-ed before it is opened (a FIFO would block the open) and
    fstat-ed after (it may have been swapped meanwhile); opened non-blocking all the same. Raises
    OSError, or TdiagError for what is not a regular file or is over MAX_SOURCE_BYTES."""
    status = os.stat(file)
    _check_readable(file, status.st_mode, status.st_size, kind)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    descriptor = os.open(file, flags)
    try:
        status = os.fstat(descriptor)
        _check_readable(file, status.st_mode, status.st_size, kind)
        chunks, left = [], MAX_SOURCE_BYTES + 1  # a file in /proc says size 0 and may be longer
        while left > 0 and (chunk := os.read(descriptor, min(left, 2**20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(descriptor)
    raw = b"".join(chunks)
    _check_readable(file, stat.S_IFREG, len(raw), kind)
    return raw


def _check_readable(file: str, mode: int, size: int, kind: str) -> None:
    if not stat.S_ISREG(mode):
        raise TdiagError(Diagnostic(f"cannot read '{file}': it is {_node_kind(mode)}, not a {kind} file"))
    if size > MAX_SOURCE_BYTES:
        mib, rest = divmod(MAX_SOURCE_BYTES, 2**20)
        limit = f"{MAX_SOURCE_BYTES:,} bytes" if rest else f"{mib} MiB"
        raise TdiagError(Diagnostic(f"cannot read '{file}': it is over {limit}, the most a {kind} file may be"))


def _not_utf8(file: str, raw: bytes, start: int, kind: str) -> TdiagError:
    line = raw[:start].count(b"\n") + 1
    column = len(raw[raw.rfind(b"\n", 0, start) + 1 : start].decode("utf-8", "replace")) + 1
    SOURCES.add(file, raw.decode("utf-8", errors="replace"))
    return TdiagError(
        Diagnostic(
            f"this file is not UTF-8 text: byte {start} is invalid",
            (Span(file, line, column, line, column + 1),),
            f"a {SUFFIXES.get(kind, kind)} file is plain text; save it as UTF-8",
        )
    )


# ---- writing ----------------------------------------------------------------------------------


def check_output(
    path: str | Path, inputs: Iterable[str | Path] = (), *, flag: str | None = None, folder: bool = False
) -> None:
    """Refuse, with OutputRefusedError, an output the command must not or cannot write: one of its
    `inputs` (by resolved path, or the same file through a hard link or bind mount), an existing
    folder (file output) or file (folder output), a device or FIFO, a place under a file, a file
    output whose folder does not exist, or a file or folder that is not writable."""
    label = f"{flag} {str(path) or repr('')}" if flag else repr(str(path))

    def refuse(reason: str) -> OutputRefusedError:
        return OutputRefusedError(Diagnostic(f"{label}: {reason}"))

    if not str(path):
        raise refuse("is empty; give a file name" if not folder else "is empty; give a folder")
    if "\0" in str(path):
        raise refuse("holds a NUL byte, which no file name can")
    if not folder and str(path).endswith(("/", os.sep)):
        raise refuse("ends with a slash, as a folder does; give a file name")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        raise refuse(f"'{_first_file_above(Path(path))}' is a file, not a folder") from None
    except OSError as error:
        raise refuse(_cause(error)) from None
    if mode is not None:
        if stat.S_ISDIR(mode) != folder:
            raise refuse("is a file; give a folder" if folder else "is a folder; give a file name")
        if not folder and not stat.S_ISREG(mode):
            raise refuse(f"is {_node_kind(mode)}; tdiag writes only regular files")
        same = same_file(path, [*inputs, *sources_read()])
        if same is not None:
            raise refuse(f"is the input '{same}'; tdiag never writes over a file it reads")
        if not folder and not os.access(path, os.W_OK):
            raise refuse("is not writable")  # read-only on purpose: not replaced either
    if folder:
        _check_folder(path, refuse)
    else:  # a symbolic link is written through: its target's folder holds the new file
        _check_file_folder(Path(os.path.realpath(path) if os.path.islink(path) else path).parent, refuse)


def _check_file_folder(parent: Path, refuse: Callable[[str], OutputRefusedError]) -> None:
    if not os.path.exists(parent):
        above = _first_file_above(parent)
        if above is not None:
            raise refuse(f"'{above}' is a file, not a folder")
        raise refuse(f"folder '{parent}' does not exist")
    if not os.path.isdir(parent):
        raise refuse(f"'{parent}' is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise refuse(f"folder '{parent}' is not writable")


def _check_folder(path: str | Path, refuse: Callable[[str], OutputRefusedError]) -> None:
    existing = Path(os.path.realpath(path))
    while not os.path.exists(existing):
        existing = existing.parent
    if not os.path.isdir(existing):
        raise refuse(f"'{existing}' is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise refuse(f"folder '{existing}' is not writable")


def _first_file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` that is not a folder, if any."""
    for above in path.parents:
        if os.path.exists(above):
            return None if os.path.isdir(above) else above
    return None


def same_file(path: str | Path, inputs: Iterable[str | Path]) -> str | None:
    """The input that `path` is, if any: the same resolved path, or the same (device, inode)."""
    real = os.path.realpath(path)
    try:
        status = os.stat(path)
    except OSError:
        status = None
    for given in inputs:
        if os.path.realpath(given) == real:
            return str(given)
        try:
            other = os.stat(given)
        except OSError:
            continue
        if status is not None and (other.st_dev, other.st_ino) == (status.st_dev, status.st_ino):
            return str(given)
    return None


def write_output(
    path: str | Path, data: str | bytes, inputs: Iterable[str | Path] = (), *, flag: str | None = None
) -> Path:
    """Write `data` (text as UTF-8) to `path` after `check_output`: into a temporary file beside
    it, then renamed over it, so the target is either its old self or complete. A symbolic link
    is written through (its target is replaced). Returns `path`."""
    check_output(path, inputs, flag=flag)
    target = Path(os.path.realpath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        replace_atomically(target, payload)
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot write '{path}': {_cause(error)}")) from None
    return Path(path)


def replace_atomically(target: Path, payload: bytes) -> None:
    """Write `payload` into a new temporary file beside `target`, flush it to disk, then rename it
    over `target` (keeping its permissions): a killed process or a full disk leaves the old file
    or the new one, never half of one, and no temporary file. OSError passes through."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    temporary, descriptor = _temporary_beside(target)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _temporary_beside(target: Path) -> tuple[Path, int]:
    """A new file in the target's folder (so the rename stays on one file system), created with
    O_EXCL under the umask's permissions."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        temporary = target.parent / f".{target.name[:200]}.{secrets.token_hex(4)}.tmp"  # within NAME_MAX
        try:
            return temporary, os.open(temporary, flags, 0o666)
        except FileExistsError:
            continue


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):  # the write failed already; that error is the one to report
        os.unlink(path)


def output_folder(path: str | Path, inputs: Iterable[str | Path] = (), *, flag: str | None = None) -> Path:
    """Create the folder `path` (and the folders above it) for a command's outputs, after
    `check_output`; returns it."""
    check_output(path, inputs, flag=flag, folder=True)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TdiagError(Diagnostic(f"cannot create folder '{path}': {_cause(error)}")) from None
    return Path(path)
