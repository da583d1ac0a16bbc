"""Reading sources and writing outputs (tdiag/files.py): only regular files of bounded size are
read, never blocking; outputs are written whole or not at all, never over a file the command read."""

import errno
import os
import threading

import pytest

import tdiag
from tdiag import TdiagError, files
from tdiag.files import (
    OutputRefusedError,
    check_output,
    one_command,
    output_folder,
    read_source,
    sources_read,
    write_output,
)

DESIGN = "design t\nsize N\ninput X[n: N]\noutput X\n"


def message(error: pytest.ExceptionInfo[TdiagError]) -> str:
    (diagnostic,) = error.value.diagnostics
    return diagnostic.message


# ---- reading ----------------------------------------------------------------------------------


def test_a_regular_file_is_read_as_utf8_text(tmp_path):
    (tmp_path / "t.td").write_text("design t  # ü\n", encoding="utf-8")
    assert read_source(tmp_path / "t.td") == "design t  # ü\n"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.td"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def read() -> None:
        with pytest.raises(TdiagError) as error:
            read_source(fifo)
        outcome.append(message(error))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open(): a writer end releases it before the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert outcome == [f"cannot read '{fifo}': it is a FIFO (named pipe), not a design file"]


def test_a_character_device_is_refused_before_it_is_read():
    with pytest.raises(TdiagError) as error:
        read_source("/dev/zero")
    assert message(error) == "cannot read '/dev/zero': it is a character device, not a design file"


def test_a_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(TdiagError) as error:
        read_source(tmp_path, "design space")
    assert message(error) == f"cannot read '{tmp_path}': it is a folder, not a design space file"


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_SOURCE_BYTES", 3 * 2**20)
    (tmp_path / "big.td").write_bytes(b"#" * (3 * 2**20 + 1))
    with pytest.raises(TdiagError) as error:
        read_source(tmp_path / "big.td")
    assert message(error) == f"cannot read '{tmp_path / 'big.td'}': it is over 3 MiB, the most a design file may be"


def test_a_file_that_reports_no_size_is_still_read_no_further_than_the_limit(monkeypatch):
    """Files in /proc say they hold 0 bytes; the limit holds for what is actually read."""
    monkeypatch.setattr(files, "MAX_SOURCE_BYTES", 64)
    with pytest.raises(TdiagError, match="it is over 64 bytes, the most a design file may be"):
        read_source("/proc/self/maps")


def test_a_design_of_ten_thousand_statements_is_read_whole(tmp_path):
    body = "".join(f"param W{k}[f: F, g: F]  # a weight\nY{k}[n g] = X[n f] W{k}[f g]\n" for k in range(10_000))
    (tmp_path / "big.td").write_text(DESIGN + body)
    assert read_source(tmp_path / "big.td") == DESIGN + body


def test_a_path_under_a_file_names_the_cause(tmp_path):
    (tmp_path / "t.td").write_text(DESIGN)
    with pytest.raises(TdiagError) as error:
        read_source(tmp_path / "t.td" / "u.td")
    assert message(error) == f"cannot read '{tmp_path / 't.td' / 'u.td'}': Not a directory"


def test_a_file_without_read_permission_names_the_cause(tmp_path, monkeypatch):
    """open(2) refusing as it does for a user without permission (the tests run as root, whom
    a chmod does not stop)."""
    path = tmp_path / "secret.td"
    path.write_text(DESIGN)
    opened = os.open

    def refuse(file, flags, *mode):
        if os.fspath(file) == str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return opened(file, flags, *mode)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(TdiagError) as error:
        read_source(path)
    assert message(error) == f"cannot read '{path}': Permission denied"


def test_a_symbolic_link_loop_names_the_cause(tmp_path):
    (tmp_path / "a.td").symlink_to("b.td")
    (tmp_path / "b.td").symlink_to("a.td")
    with pytest.raises(TdiagError) as error:
        read_source(tmp_path / "a.td")
    assert message(error) == f"cannot read '{tmp_path / 'a.td'}': Too many levels of symbolic links"


def test_a_path_with_a_nul_byte_is_refused_by_name_for_a_source_and_for_tdiag_load():
    with pytest.raises(TdiagError) as error:
        read_source("a\0b.td")
    assert message(error) == "no design file can be named 'a\\x00b.td': a file name holds no NUL byte"
    with pytest.raises(TdiagError, match="a file name holds no NUL byte"):
        tdiag.load("a\0b.td")


def test_a_missing_file_gives_the_error_the_caller_chose(tmp_path):
    with pytest.raises(TdiagError, match="no such design space file"):
        read_source(tmp_path / "none.tds", "design space")
    with pytest.raises(TdiagError, match="custom"):
        read_source(tmp_path / "none.td", missing=lambda file: TdiagError(files.Diagnostic(f"custom {file}")))


def test_a_byte_that_is_not_utf8_is_an_error_at_its_line_and_column(tmp_path):
    (tmp_path / "t.td").write_bytes(b"design t\n# caf\xe9\n")
    with pytest.raises(TdiagError) as error:
        read_source(tmp_path / "t.td")
    (diagnostic,) = error.value.diagnostics
    assert diagnostic.message == "this file is not UTF-8 text: byte 14 is invalid"
    assert (diagnostic.spans[0].line, diagnostic.spans[0].column) == (2, 6)


def test_every_source_read_in_a_command_is_recorded(tmp_path):
    (tmp_path / "t.td").write_text(DESIGN)
    with one_command() as read:
        read_source(tmp_path / "t.td")
        assert read == [str(tmp_path / "t.td")] == sources_read()
    assert sources_read() == []


# ---- writing ----------------------------------------------------------------------------------


def test_an_output_replaces_the_previous_file_and_keeps_its_permissions(tmp_path):
    out = tmp_path / "out.py"
    out.write_text("old")
    out.chmod(0o640)
    write_output(out, "new")
    assert out.read_text() == "new" and out.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["out.py"]


def test_a_new_output_gets_the_permissions_of_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_output(tmp_path / "out.py", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "out.py").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("code", "cause"), [(errno.ENOSPC, "No space left on device"), (errno.EFBIG, "File too large")]
)
def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch, code, cause):
    out = tmp_path / "out.py"
    out.write_text("good")

    def full(descriptor: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(TdiagError) as error:
        write_output(out, "x" * 10_000)
    monkeypatch.undo()
    assert message(error) == f"cannot write '{out}': {cause}"
    assert out.read_text() == "good" and os.listdir(tmp_path) == ["out.py"]


def test_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    def refuse(source: str, target: str) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(TdiagError, match="Invalid cross-device link"):
        write_output(tmp_path / "out.py", "x")
    assert os.listdir(tmp_path) == []


def test_an_interrupted_write_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupt(descriptor: int, data: bytes) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_output(tmp_path / "out.py", "x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_an_output_with_the_longest_name_the_folder_allows_is_written(tmp_path):
    out = tmp_path / ("x" * (os.pathconf(tmp_path, "PC_NAME_MAX") - 3) + ".py")
    write_output(out, "x")
    assert out.read_text() == "x" and os.listdir(tmp_path) == [out.name]


def test_a_symbolic_link_output_is_written_through(tmp_path):
    (tmp_path / "target.py").write_text("old")
    (tmp_path / "link.py").symlink_to("target.py")
    write_output(tmp_path / "link.py", "new")
    assert (tmp_path / "link.py").is_symlink() and (tmp_path / "target.py").read_text() == "new"


@pytest.mark.parametrize("link", ["same path", "symbolic link", "hard link", "relative path"])
def test_an_output_that_is_an_input_is_refused(tmp_path, monkeypatch, link):
    source = tmp_path / "a.td"
    source.write_text(DESIGN)
    monkeypatch.chdir(tmp_path)
    out = {
        "same path": source,
        "symbolic link": tmp_path / "link.td",
        "hard link": tmp_path / "hard.td",
        "relative path": "./sub/../a.td",
    }[link]
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.td").symlink_to(source)
    os.link(source, tmp_path / "hard.td")
    with pytest.raises(OutputRefusedError) as error:
        write_output(out, "python", [source], flag="-o")
    assert message(error) == f"-o {out}: is the input '{source}'; tdiag never writes over a file it reads"
    assert source.read_text() == DESIGN


def test_an_output_is_refused_over_any_source_read_in_the_command(tmp_path):
    (tmp_path / "base.td").write_text(DESIGN)
    with one_command():
        read_source(tmp_path / "base.td")
        with pytest.raises(OutputRefusedError, match="is the input"):
            write_output(tmp_path / "base.td", "python")
    assert (tmp_path / "base.td").read_text() == DESIGN


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("folder", "is a folder; give a file name"),
        ("under a file", "'{tmp}/file' is a file, not a folder"),
        ("missing folder", "folder '{tmp}/none' does not exist"),
        ("device", "is a character device; tdiag writes only regular files"),
        ("folder-like name", "ends with a slash, as a folder does; give a file name"),
    ],
)
def test_an_output_that_cannot_be_a_file_is_refused_naming_why(tmp_path, where, reason):
    (tmp_path / "file").write_text("")
    out = {
        "folder": tmp_path,
        "under a file": tmp_path / "file" / "out.py",
        "missing folder": tmp_path / "none" / "out.py",
        "device": "/dev/null",
        "folder-like name": f"{tmp_path}/new/",
    }[where]
    with pytest.raises(OutputRefusedError) as error:
        check_output(out, flag="-o")
    assert message(error) == f"-o {out}: {reason.format(tmp=tmp_path)}"


def test_a_read_only_output_is_refused_not_replaced(tmp_path, monkeypatch):
    """The permission check of access(2); faked, since the tests run as root, who may write anything."""
    out = tmp_path / "kept.py"
    out.write_text("kept")
    granted = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != str(out) and granted(path, mode))
    with pytest.raises(OutputRefusedError) as error:
        write_output(out, "new", flag="-o")
    assert message(error) == f"-o {out}: is not writable" and out.read_text() == "kept"


def test_an_empty_output_name_is_refused():
    with pytest.raises(OutputRefusedError) as error:
        check_output("", flag="-o")
    assert message(error) == "-o '': is empty; give a file name"


def test_an_output_name_with_a_nul_byte_is_refused(tmp_path):
    with pytest.raises(OutputRefusedError) as error:
        write_output(tmp_path / "a\0.py", "x")
    assert message(error).endswith(": holds a NUL byte, which no file name can")


def test_an_output_on_a_file_system_that_takes_no_files_names_the_cause():
    with pytest.raises(TdiagError) as error:
        write_output("/proc/tdiag_out.py", "x")
    assert message(error).startswith("cannot write '/proc/tdiag_out.py': ")


def test_an_output_folder_is_created_with_the_folders_above_it(tmp_path):
    assert output_folder(tmp_path / "a" / "b", flag="--out").is_dir()


def test_an_output_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputRefusedError) as error:
        output_folder(tmp_path / "file" / "out", flag="--out")
    assert message(error) == f"--out {tmp_path / 'file' / 'out'}: '{tmp_path / 'file'}' is a file, not a folder"
