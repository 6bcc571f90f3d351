"""Split a large file into parts of at most N MiB with a manifest, and join them back, checked by sha256.

    python3 training/chunks.py split FILE --max-mib 50 --into DIR     # DIR/NAME.partNN, DIR/NAME.manifest.json
    python3 training/chunks.py join DIR/NAME.manifest.json --out FILE  # every part and the whole file checked

What moves a model to the GPU machine (a call carries at most 64 MiB, so a GGUF goes over in 50 MiB parts,
one or a few per call) and an adapter back (at most 16 MiB a file). A part that is missing, of another
size or another hash stops the join with its name, and nothing is written at ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

MIB = 1 << 20
BLOCK = 4 * MIB


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, into: Path, max_mib: float) -> Path:
    """Write ``path``'s parts and manifest into ``into``; returns the manifest's path."""
    limit = int(max_mib * MIB)
    if limit <= 0:
        raise ValueError("--max-mib must be positive")
    into.mkdir(parents=True, exist_ok=True)
    parts = []
    whole = hashlib.sha256()
    with open(path, "rb") as source:
        number = 0
        while True:
            data = source.read(limit)
            if not data and number:
                break
            whole.update(data)
            part = into / f"{path.name}.part{number:02d}"
            part.write_bytes(data)
            parts.append({"file": part.name, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            number += 1
            if len(data) < limit:
                break
    manifest = into / f"{path.name}.manifest.json"
    manifest.write_text(json.dumps({"file": path.name, "size_bytes": path.stat().st_size,
                                    "sha256": whole.hexdigest(), "parts": parts}, indent=1) + "\n")
    return manifest


class JoinError(Exception):
    pass


def join(manifest_path: Path, out: Path) -> Path:
    """The parts the manifest names, checked and concatenated at ``out``."""
    manifest = json.loads(manifest_path.read_text())
    folder = manifest_path.parent
    for part in manifest["parts"]:
        path = folder / part["file"]
        if not path.is_file():
            raise JoinError(f"{part['file']} is missing")
        if path.stat().st_size != part["size_bytes"] or _sha256(path) != part["sha256"]:
            raise JoinError(f"{part['file']} is not the part the manifest names (size or sha256)")
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as target:
        for part in manifest["parts"]:
            with open(folder / part["file"], "rb") as handle:
                for block in iter(lambda: handle.read(BLOCK), b""):
                    target.write(block)
    if partial.stat().st_size != manifest["size_bytes"] or _sha256(partial) != manifest["sha256"]:
        partial.unlink()
        raise JoinError(f"the joined file is not {manifest['file']} (size or sha256)")
    os.replace(partial, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("--into", type=Path, required=True)
    s.add_argument("--max-mib", type=float, default=50.0)
    j = actions.add_parser("join")
    j.add_argument("manifest", type=Path)
    j.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.action == "split":
        manifest = split(args.file, args.into, args.max_mib)
        print(f"{manifest}: {len(json.loads(manifest.read_text())['parts'])} parts")
        return 0
    try:
        print(join(args.manifest, args.out))
    except (JoinError, OSError, ValueError, KeyError) as exc:
        print(f"chunks: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
