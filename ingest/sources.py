"""What ``submit`` was given, read in the submitting process: paths, folders, (name, bytes) pairs.

Each source becomes a :class:`SourceFile` (its document name and bytes) or a :class:`Refusal`
naming it and saying why: it cannot be read, is not a regular file, is empty, is larger than
``INGEST_MAX_DOC_BYTES``, or is reached through a symbolic link the submitter did not allow.
Content problems (a corrupt PDF) are not found here: the parser fails the task. Files are
yielded one at a time so a large folder is never held in memory at once.

Symbolic links (issue 17): whoever can write into a submitted folder must not be able to make
the submitting process read something else it can read (``/etc/shadow``, another tenant's
upload). Unless ``follow_links``: a file under a folder whose real path (every link resolved,
checked on the file actually opened) is outside the folder's real path is refused; a path named
directly that is itself a link (file or folder) is refused, since a glob (``ingest submit
/uploads/*``) names links nobody chose. Links that stay inside the folder are read. Linked
folders inside a folder are never descended (no loops), with or without ``follow_links``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_NAME_CHARS = 255  # the document table's name column
Source = str | os.PathLike[str] | tuple[str, bytes]


@dataclass(frozen=True)
class SourceFile:
    name: str  # the document's name in its knowledge base (a folder's files: relative path)
    origin: str  # what the user named: the path, or the name of a (name, bytes) pair
    data: bytes


@dataclass(frozen=True)
class Refusal:
    origin: str
    reason: str


FOLLOW_HINT = "--follow-links (follow_links=True) allows it"


def read_sources(
    sources: Iterable[Source], max_doc_bytes: int, *, follow_links: bool = False
) -> Iterator[SourceFile | Refusal]:
    """Yield each file named by ``sources`` (a folder: its files, recursively) or its refusal;
    ``follow_links`` reads through symbolic links wherever they point (see the module's doc)."""
    for source in sources:
        if isinstance(source, tuple):
            yield _from_pair(source, max_doc_bytes)
            continue
        path = Path(os.fspath(source))
        if path.is_symlink() and not follow_links:
            kind = "folder" if path.is_dir() else "file"
            yield Refusal(
                str(path),
                f"is a symbolic link (to the {kind} {os.path.realpath(path)}): name its target, or {FOLLOW_HINT}",
            )
        elif path.is_dir():
            inside = None if follow_links else os.path.realpath(path)
            found = False
            for file_path, name in _walk(path):
                found = True
                yield _from_path(file_path, name, max_doc_bytes, inside=inside)
            if not found:
                yield Refusal(str(path), "folder holds no files")
        else:
            yield _from_path(path, path.name, max_doc_bytes)


def source_names(sources: Iterable[Source]) -> list[str]:
    """The document names ``sources`` give (a folder: its files), without reading any bytes."""
    names: list[str] = []
    for source in sources:
        if isinstance(source, tuple):
            names.append(str(source[0]))
            continue
        path = Path(os.fspath(source))
        if path.is_dir():
            names += [name for _, name in _walk(path)]
        else:
            names.append(path.name)
    return names


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
    """Files under ``root`` in a stable order, hidden ones (``.git``, ``.DS_Store``) left out;
    symlinked folders are not followed (no loops)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if filename.startswith("."):
                continue
            full = Path(dirpath) / filename
            yield full, full.relative_to(root).as_posix()


def _check(origin: str, name: str, size: int, max_doc_bytes: int) -> Refusal | None:
    if not name:
        return Refusal(origin, "has no name")
    if len(name) > MAX_NAME_CHARS:
        return Refusal(origin, f"name longer than {MAX_NAME_CHARS} characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a file system name in another encoding (os.walk's surrogates)
        printable = origin.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return Refusal(printable, "name is not valid UTF-8 (rename the file)")
    if size == 0:
        return Refusal(origin, "is empty")
    if size > max_doc_bytes:
        return Refusal(
            origin, f"is larger than the limit ({size} > {max_doc_bytes} bytes, INGEST_MAX_DOC_BYTES)"
        )
    return None


def _from_pair(pair: tuple[str, bytes], max_doc_bytes: int) -> SourceFile | Refusal:
    name, data = pair
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return Refusal(str(name), f"holds {type(data).__name__}, not bytes")
    data = bytes(data)
    refusal = _check(str(name), str(name), len(data), max_doc_bytes)
    return refusal or SourceFile(name=str(name), origin=str(name), data=data)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _opened_path(fd: int, path: Path) -> str:
    """The real path of the file ``fd`` holds open: what was read, not what the name pointed to
    a moment before (Linux's /proc; elsewhere the name resolved again)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def _outside(origin: str, target: str) -> Refusal:
    return Refusal(
        origin, f"is a symbolic link to {target}, outside the submitted folder: not read; {FOLLOW_HINT}"
    )


def _from_path(
    path: Path, name: str, max_doc_bytes: int, *, inside: str | None = None
) -> SourceFile | Refusal:
    """Read one file; with ``inside`` (a folder's real path) only if its real path is under it."""
    origin = str(path)
    if inside is not None and not _within(target := os.path.realpath(path), inside):
        return _outside(origin, target)
    try:
        # O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        kind = "is a broken symbolic link" if path.is_symlink() else "does not exist"
        return Refusal(origin, f"cannot be read: {kind}")
    except OSError as exc:
        return Refusal(origin, f"cannot be read: {exc.strerror or exc}")
    try:
        if inside is not None and not _within(opened := _opened_path(fd, path), inside):
            return _outside(origin, opened)  # a link swapped in since the check above
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Refusal(origin, "cannot be read: not a regular file")
        refusal = _check(origin, name, info.st_size, max_doc_bytes)
        if refusal:
            return refusal
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(max_doc_bytes + 1)  # the file may have grown since fstat
    except OSError as exc:
        return Refusal(origin, f"cannot be read: {exc.strerror or exc}")
    finally:
        os.close(fd)
    return _check(origin, name, len(data), max_doc_bytes) or SourceFile(name=name, origin=origin, data=data)
