"""LoRA on the local model from the verified chats, exported as a GGUF LoRA that ``modelLora`` loads.

    python3 training/train_lora.py --base MODEL.gguf --data training/data/chats.jsonl --out DIR
        [--epochs 2] [--rank 16] [--alpha 32] [--lr 2e-4] [--max-tokens 3072] [--max-steps N] [--device cuda]
        [--dtype f16] [--heldout-rows N] [--jobs planner,editor]

Runs where torch, transformers, peft and the gguf package are (the GPU machine; a CPU works for a few
steps). The base is the same GGUF the editor loads: transformers dequantizes it into a torch model
(``from_pretrained(folder, gguf_file=...)``), so the adapter is trained on the weights llama.cpp then
applies it to. Only ``train`` rows are read (held-out kernels never are). Each chat is rendered with the
GGUF's own chat template, as llama.cpp renders it for the jobs, and the loss is the assistant's answer's
tokens only. Writes to ``--out``: ``adapter/`` (PEFT's ``adapter_config.json`` and
``adapter_model.safetensors``), ``adapter.gguf`` (``kernel-lsp models convert-lora``'s conversion) and
``train_log.json`` (the command, the machine, every step's loss, the rows used, the held-out rows'
loss before and after training, the adapter's size and sha256).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The projections of every block LoRA adapts (Qwen2's names; lora_gguf maps them to the GGUF's).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_rows(path: Path, split: str, jobs: set[str]) -> list[dict]:
    return [row for row in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            if row["metadata"]["split"] == split and row["metadata"]["job"] in jobs]


def encode(tokenizer, row: dict, max_tokens: int) -> tuple[list[int], list[int]] | None:
    """(input ids, labels) of one chat: the prompt's labels are -100, the answer's its tokens; None when
    the chat is longer than ``max_tokens``."""
    messages = row["messages"]
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full = prompt + messages[-1]["content"] + (tokenizer.eos_token or "")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    if len(ids) > max_tokens or ids[:len(prompt_ids)] != prompt_ids:
        return None
    return ids, [-100] * len(prompt_ids) + ids[len(prompt_ids):]


def mean_loss(model, torch, batches: list[tuple[list[int], list[int]]], device: str) -> float | None:
    if not batches:
        return None
    model.eval()
    total = 0.0
    with torch.no_grad():
        for ids, labels in batches:
            out = model(input_ids=torch.tensor([ids], device=device), labels=torch.tensor([labels], device=device))
            total += float(out.loss)
    model.train()
    return total / len(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the base GGUF (the one the editor loads)")
    parser.add_argument("--data", type=Path, default=ROOT / "training" / "data" / "chats.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--max-tokens", type=int, default=3072)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a smoke run)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("f16", "f32"), default="f16", help="the GGUF adapter's tensor type")
    parser.add_argument("--heldout-rows", type=int, default=None, help="score only the first N held-out rows")
    parser.add_argument("--jobs", default="planner,editor", help="the jobs whose chats are read")
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernel_lsp.services import lora_gguf

    started = time.monotonic()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    folder, name = str(args.base.parent), args.base.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).to(device)
    loaded_s = time.monotonic() - started
    jobs = set(args.jobs.split(","))
    train_rows, heldout_rows = read_rows(args.data, "train", jobs), read_rows(args.data, "heldout", jobs)
    train = [e for e in (encode(tokenizer, r, args.max_tokens) for r in train_rows) if e is not None]
    heldout = [e for e in (encode(tokenizer, r, args.max_tokens) for r in heldout_rows) if e is not None]
    heldout = heldout[:args.heldout_rows] if args.heldout_rows is not None else heldout
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.05,
                                             target_modules=list(TARGETS), bias="none", task_type="CAUSAL_LM"))
    heldout_before = mean_loss(model, torch, heldout, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    steps = math.ceil(args.epochs * len(train))
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    losses: list[float] = []
    order: list[int] = []
    model.train()
    for step in range(steps):
        if not order:
            order = list(range(len(train)))
            random.shuffle(order)
        ids, labels = train[order.pop()]
        out = model(input_ids=torch.tensor([ids], device=device), labels=torch.tensor([labels], device=device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:  # linear decay to 10 % of the rate
            group["lr"] = args.lr * (1.0 - 0.9 * step / max(steps - 1, 1))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(out.loss.detach()))
        print(f"step {step + 1}/{steps}: loss {losses[-1]:.4f}", flush=True)
    heldout_after = mean_loss(model, torch, heldout, device)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out / "adapter"))
    converted = lora_gguf.convert(args.out / "adapter", args.base, args.out / "adapter.gguf", dtype=args.dtype)
    log = {
        "command": " ".join(["python3", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"},
        "base": {"file": name, "size_bytes": os.path.getsize(args.base)},
        "settings": {"epochs": args.epochs, "rank": args.rank, "alpha": args.alpha, "lr": args.lr,
                     "max_tokens": args.max_tokens, "targets": list(TARGETS), "seed": args.seed, "dtype": args.dtype,
                     "jobs": sorted(jobs)},
        "rows": {"train": len(train_rows), "train_used": len(train), "heldout": len(heldout_rows),
                 "heldout_used": len(heldout)},
        "steps": steps,
        "loss": losses,
        "heldout_loss_before": heldout_before,
        "heldout_loss_after": heldout_after,
        "adapter": {"file": converted.path.name, "size_bytes": converted.size_bytes, "sha256": converted.sha256,
                    "pairs": converted.tensor_pairs},
        "wall_s": {"load": loaded_s, "total": time.monotonic() - started},
    }
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"{steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; held-out loss {heldout_before} -> {heldout_after}; "
          f"{converted.path} ({converted.size_bytes} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
