"""Errors that reach the user.

A :class:`RelaxwebError` is a problem with what the user gave us (a bad model file, an
unsupported op, a wrong input shape, a bound exceeded).  The CLI prints its message as one
``error: ...`` line on stderr and exits with status 2.  Anything else is a bug in relaxweb
and keeps its traceback.
"""

import os
import stat


class RelaxwebError(Exception):
    """A user-facing error: the message is complete and readable on its own."""


class UnsupportedModelError(RelaxwebError):
    """The model uses ops (or attributes) relaxweb cannot compile yet."""


class InputShapeError(RelaxwebError):
    """An input's shape or dtype does not match what the bundle accepts."""


def shortened(text: str, most: int = 200) -> str:
    """A text from a user or a model as a message shows it: at most ``most`` characters (a
    hostile path or name may have thousands), ``...`` where it was cut."""
    return text if len(text) <= most else f"{text[:most - 3]}..."


def shown(name: str) -> str:
    """A name from a model as an error message shows it: as written when it is printable,
    else with its line breaks and control characters escaped (``a\\nb``), so a message stays
    one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(name))


def path_kind(path: str | os.PathLike) -> str | None:
    """What is at a path the user named: ``"folder"``, ``"file"`` (a regular file), ``"other"``
    (a FIFO, a device, a socket: reading one may never end) or None (nothing there).  A name
    that cannot be looked up at all (too long, a loop of links, no permission) is a
    RelaxwebError saying so, where ``Path.is_file`` would raise OSError."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as error:  # ValueError: a NUL in the name
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise RelaxwebError(f"{shown(shortened(os.fsdecode(path)))}: {reason}") from None
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
