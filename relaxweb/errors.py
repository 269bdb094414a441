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


class RunCheckError(RelaxwebError):
    """A check of a run's data inside a kernel failed (an index out of range of its axis):
    the kernel reported it in the run's status (docs/design.md, "Errors found by kernels"),
    and the message names the model's node, as onnxruntime would refuse the same inputs."""


#: The u32 words of a run's status (``relaxweb/ir/error_sites.py``): word 0 the site of the
#: run's first error (0: none), then the values its message shows.
STATUS_WORDS = 8


def run_error_message(node: str, op: str, template: str, values) -> str:
    """The message of an error a kernel reported at one of the manifest's ``run_errors``
    sites: ``node 'Gather_3' (Gather): index 7 is out of range for axis 0 of extent 4``.
    ``template`` holds ``{0}``, ``{1}`` ... for the values the kernel wrote (signed 32-bit);
    the node's name and op are the model's text, shown on one line.  The JS runtime's
    ``runErrorMessage`` (``runtime_js/host.js``) writes the same."""
    text = str(template)
    for position, value in enumerate(values):
        text = text.replace("{" + str(position) + "}", str(int(value)))
    where = f"node '{shortened(shown(node))}' ({shortened(shown(op))})" if node else shortened(shown(op))
    return f"{where}: {text}"


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
