"""What a path the user names is, checked before nanoDist reads or writes it.

    check_name(path)       every component within NAME_MAX_BYTES (else the OS answers ENAMETOOLONG deep
                           inside some call, which used to surface as an internal error)
    check_output(path)     nothing there, or a regular file (or a link to one): rename-over would replace
                           a device node, a FIFO or a socket with a regular file, and a folder cannot be
    read_small(path)       a regular file of at most MAX_CONFIG_BYTES, read without ever blocking: a preset,
                           cluster, calibration or user config is small, and /dev/zero or a FIFO is a mistake
    open_regular(path)     a regular file opened for reading (a FIFO would block open() until a writer came)

Each mistake is a PathError whose str() is one line: the path, what is wrong, the fix. A shared leaf at the
top (standard library only) so the spine's data.py may use it as well as run/, config/ and the CLI.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

NAME_MAX_BYTES = 255  # one path component: ext4, xfs, btrfs, tmpfs, APFS and NTFS all stop here
MAX_CONFIG_BYTES = 1 << 20  # presets, clusters, calibrations, user config: the largest shipped is ~10 KiB

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


class PathError(ValueError):
    """A path naming the wrong kind of thing, too long a name, or too big a file; str() is one line."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str):
        super().__init__(problem)
        self.path, self.problem, self.fix = str(path), problem, fix

    def __str__(self) -> str:
        return " ".join(f"{self.path}: {self.problem}; {self.fix}".split())

    def __reduce__(self):  # picklable, so it can cross from a rank process to the launcher
        return PathError, (self.path, self.problem, self.fix)


def kind(mode: int) -> str:
    """'a folder', 'a FIFO', ... for an st_mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def too_long(path: str | os.PathLike) -> PathError:
    """The error for a name the file system refused as too long (ENAMETOOLONG), wherever it was raised."""
    return PathError(path, f"a name in this path is longer than the file system allows ({NAME_MAX_BYTES} "
                     "bytes per name)", "choose a shorter name")


def check_name(path: str | os.PathLike) -> Path:
    """`path` as a Path, if each of its names fits in NAME_MAX_BYTES."""
    path = Path(path)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX_BYTES:
            raise PathError(path, f"a name in this path is {size} bytes, over the {NAME_MAX_BYTES} bytes a "
                            "file system allows per name", "choose a shorter name")
    return path


def _stat(path: Path) -> os.stat_result | None:
    """os.stat (following links), None when nothing is there; ENAMETOOLONG becomes a PathError."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise too_long(path) from None
        raise


def check_output(path: str | os.PathLike) -> Path:
    """A place a file may be written by renaming over it: nothing there yet, or a regular file."""
    path = check_name(path)
    found = _stat(path)
    if found is not None and not stat.S_ISREG(found.st_mode):
        what = kind(found.st_mode)
        fix = (f"name a file inside it, e.g. {path / 'out'}" if stat.S_ISDIR(found.st_mode)
               else "nanoDist only replaces regular files; choose another file name")
        raise PathError(path, f"is {what}, not a regular file", fix)
    return path


def _refuse_unless_regular(path: Path, mode: int, size: int, limit: int | None) -> None:
    if not stat.S_ISREG(mode):
        raise PathError(path, f"is {kind(mode)}, not a regular file", "give a regular file")
    if limit is not None and size > limit:
        raise PathError(path, f"is {size} bytes, more than the {limit} a file of this kind may be",
                        "give the right file (is it the one you meant?)")


def open_regular(path: str | os.PathLike, limit: int | None = None) -> IO[bytes]:
    """A regular file opened for binary reading; anything else (a FIFO, a device, a folder) is refused
    before it is opened, and again on the open descriptor in case it was swapped in between."""
    path = check_name(Path(path).expanduser())
    found = _stat(path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    _refuse_unless_regular(path, found.st_mode, found.st_size, limit)
    # O_NONBLOCK: should a FIFO appear there after the stat, open() returns at once instead of waiting
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        now = os.fstat(fd)
        _refuse_unless_regular(path, now.st_mode, now.st_size, limit)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(path: str | os.PathLike, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """A regular file's bytes, at most `limit` of them: the read stops at limit + 1, so a file that grew
    after the size check is refused too, never read whole."""
    with open_regular(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PathError(path, f"is more than the {limit} bytes a file of this kind may be",
                        "give the right file (is it the one you meant?)")
    return data
