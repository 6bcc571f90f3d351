"""A PEFT LoRA adapter as a GGUF LoRA that llama.cpp loads over its base model (``modelLora``).

PEFT saves an adapter as ``adapter_config.json`` (rank ``r``, ``lora_alpha``, the target modules) and
``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight``, shape (r, in), and
``...lora_B.weight``, shape (out, r), for each Hugging Face module adapted). llama.cpp reads an adapter
as a GGUF file of ``general.type = adapter``, ``adapter.type = lora`` and ``adapter.lora.alpha``, whose
tensors are named after the base GGUF's (``blk.0.attn_q.weight.lora_a`` and ``.lora_b``), and applies
``W x + (alpha / r) B A x`` to each. The module names are mapped by the ``gguf`` package's tensor name
map for the base's architecture; every pair is checked against the base GGUF's tensor of that name
(``A``'s columns are its input width, ``B``'s rows its output width), so an adapter trained on another
model is refused before llama.cpp would refuse it at load time, with a message naming the tensor.

Refused, with the reason: DoRA, per-module ranks or alphas, adapted biases, modules saved whole
(``modules_to_save``), and targets that are not a block's 2-D weight. rsLoRA's scale (alpha / sqrt(r))
is kept by writing alpha * sqrt(r) as the GGUF alpha.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.services.models import ModelError

#: PEFT's prefix of a saved adapter's tensor names, and its suffixes for the two factors.
PEFT_PREFIX = "base_model.model."
_FACTORS = {".lora_A.weight": "lora_a", ".lora_B.weight": "lora_b"}
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraConversionError(ModelError):
    """An adapter that cannot be written for the base model, and why."""


@dataclass(frozen=True)
class ConvertedLora:
    path: Path
    architecture: str
    rank: int
    alpha: float
    """The GGUF's ``adapter.lora.alpha`` (rsLoRA's scale folded in)."""
    tensor_pairs: int
    size_bytes: int
    sha256: str


def _imports():
    try:
        import gguf
        import numpy
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise LoraConversionError(f"converting an adapter needs the gguf and safetensors packages ({exc.name} is "
                                  "missing): pip install 'kernel-lsp[model]'") from exc
    return gguf, numpy, load_file


def read_config(adapter_dir: Path) -> tuple[int, float]:
    """(rank, the GGUF alpha) of a PEFT LoRA adapter folder."""
    try:
        config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoraConversionError(f"{adapter_dir / ADAPTER_CONFIG}: not a readable adapter config ({exc})") from exc
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise LoraConversionError(f"{ADAPTER_CONFIG}: peft_type is {config.get('peft_type')!r}, not LORA")
    refused = [f"{why} ({name})" for name, why in (("use_dora", "DoRA's magnitude vectors"),
                                                   ("rank_pattern", "per-module ranks"),
                                                   ("alpha_pattern", "per-module alphas"),
                                                   ("modules_to_save", "modules saved whole"))
               if config.get(name)]
    if config.get("bias", "none") != "none":
        refused.append(f"adapted biases (bias = {config['bias']!r})")
    if refused:
        raise LoraConversionError(f"{ADAPTER_CONFIG}: llama.cpp's LoRA format has no place for {', '.join(refused)}")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, (int, float)):
        raise LoraConversionError(f"{ADAPTER_CONFIG}: r={rank!r} and lora_alpha={alpha!r} are not a rank and an alpha")
    scale_alpha = float(alpha) * math.sqrt(rank) if config.get("use_rslora") else float(alpha)
    return rank, scale_alpha


def _base_tensors(gguf, base_gguf: Path) -> tuple[str, int, dict[str, tuple[int, ...]]]:
    """(architecture, block count, tensor name -> ggml shape, inner dimension first) of the base GGUF."""
    try:
        reader = gguf.GGUFReader(str(base_gguf))
    except (OSError, ValueError) as exc:
        raise LoraConversionError(f"{base_gguf}: not a readable GGUF file ({exc})") from exc
    arch_field = reader.fields.get(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise LoraConversionError(f"{base_gguf}: no {gguf.Keys.General.ARCHITECTURE}")
    arch = str(arch_field.contents())
    blocks_field = reader.fields.get(gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch))
    blocks = int(blocks_field.contents()) if blocks_field is not None else 0
    return arch, blocks, {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}


#: Tensor types the factors may be written in (llama.cpp applies either): f16 halves the file.
DTYPES = ("f32", "f16")


def convert(adapter_dir: str | os.PathLike[str], base_gguf: str | os.PathLike[str],
            out_path: str | os.PathLike[str], dtype: str = "f32") -> ConvertedLora:
    """Write the PEFT adapter in ``adapter_dir`` as a GGUF LoRA for ``base_gguf`` at ``out_path``, its factors
    as ``dtype`` (one of :data:`DTYPES`)."""
    if dtype not in DTYPES:
        raise LoraConversionError(f"tensor type {dtype!r}: one of {', '.join(DTYPES)}")
    gguf, numpy, load_file = _imports()
    adapter_dir, base_gguf, out_path = Path(adapter_dir), Path(base_gguf), Path(out_path)
    rank, alpha = read_config(adapter_dir)
    arch, blocks, base = _base_tensors(gguf, base_gguf)
    archs = {name: value for value, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        raise LoraConversionError(f"{base_gguf}: the gguf package has no tensor names for architecture {arch!r}")
    names = gguf.get_tensor_name_map(archs[arch], blocks)
    try:
        weights = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    except (OSError, ValueError) as exc:
        raise LoraConversionError(f"{adapter_dir / ADAPTER_WEIGHTS}: not readable safetensors ({exc})") from exc
    pairs: dict[str, dict[str, object]] = {}
    for key, value in weights.items():
        suffix = next((s for s in _FACTORS if key.endswith(s)), None)
        if suffix is None or not key.startswith(PEFT_PREFIX):
            raise LoraConversionError(f"{ADAPTER_WEIGHTS}: tensor {key!r} is not a LoRA factor of a base module")
        factor, module = _FACTORS[suffix], key[len(PEFT_PREFIX):-len(suffix)]
        target = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if target is None or not target.startswith("blk."):
            raise LoraConversionError(f"{ADAPTER_WEIGHTS}: {module!r} is not a block's weight of a {arch} model")
        pairs.setdefault(target, {})[factor] = value
    if not pairs:
        raise LoraConversionError(f"{ADAPTER_WEIGHTS}: no LoRA factors")
    for target, factors in sorted(pairs.items()):
        if set(factors) != {"lora_a", "lora_b"}:
            raise LoraConversionError(f"{target}: only {', '.join(factors)} is in the adapter")
        shape = base.get(target)
        a, b = factors["lora_a"], factors["lora_b"]
        if shape is None or len(shape) != 2:
            raise LoraConversionError(f"{target}: the base model {base_gguf.name} has no 2-D tensor of that name")
        width_in, width_out = shape
        if a.shape != (rank, width_in) or b.shape != (width_out, rank):
            raise LoraConversionError(
                f"{target}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the base's "
                f"{width_out}x{width_in} weight at rank {rank} (trained on another model?)")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for target, factors in sorted(pairs.items()):
        for factor in ("lora_a", "lora_b"):
            writer.add_tensor(f"{target}.{factor}", numpy.ascontiguousarray(
                factors[factor], dtype=numpy.float16 if dtype == "f16" else numpy.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, out_path)
    digest = hashlib.sha256()
    with open(out_path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return ConvertedLora(path=out_path, architecture=arch, rank=rank, alpha=alpha, tensor_pairs=len(pairs),
                         size_bytes=out_path.stat().st_size, sha256=digest.hexdigest())
