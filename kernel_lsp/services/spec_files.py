"""Writing a drafted launch spec beside its source file.

The "Create launch spec" action writes the sidecar itself (rather than handing
the editor a WorkspaceEdit that some clients apply to a hidden, unsaved
buffer), so the file exists at once for the server's own look-ups and the
editor only has to show it. An existing file is never overwritten.
"""

from __future__ import annotations

import os


def write_new_spec(path: str, text: str) -> str | None:
    """Create ``path`` with ``text``; None when done, else why not (it exists, the folder is read-only…)."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        return f"{os.path.basename(path)} exists already; it was left as it is"
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None
