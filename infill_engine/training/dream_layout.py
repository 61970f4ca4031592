"""A diffill model as a Dream-layout checkpoint: transformers' Qwen2 weights, every token reading every other.

Dream-family checkpoints (Dream, DiffuCoder, Open-dCoder) are 0.5-7B parameters, too large to evaluate on this
project's machines, and the tests' tiny ones have random weights, whose flat predictions say little about what a
trained model does. What depends on a trained model's predictions (the dual cache's effect on pass@1:
docs/BENCHMARKS.md, "Dual cache") is measured here on a small trained one instead: the embedded model's weights map
one to one onto Qwen2's (its fused q/k/v and gate/up projections split, the q/k/v biases zero; its rotary embedding
is Qwen2's), and with the attention made causal the two give the same next-token logits. Read both ways, as Dream
reads (the context now sees the canvas), the model is fine-tuned on the embedded model's objective: masked-diffusion
loss on the span, position p predicted from the output at p - 1. The result is saved as Dream's checkpoints are laid
out (`model_type` "Dream", Qwen2's tensor names), so the engine loads it through its `dream` path, dual cache and
all, without any code of the checkpoint's.

    python -m infill_engine.training.dream_layout OUT --corpus RUN_DIR [--init-from MODEL] [--steps 1000]
        [--lr 3e-4] [--batch-size 16] [--checkpoint-every 250] [--seed 24] [--threads 1]

OUT/step-N are the checkpoints (bfloat16 safetensors, each written beside itself and renamed into place), OUT/log.csv
the losses. Not resumable: a run is 20-25 minutes on one CPU thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX, masked_diffusion_loss
from infill_engine.training.example_stream import ExampleStream
from infill_engine.training.held_out import held_out_batches
from infill_engine.training.objective import ObjectiveConfig

LOG_FILE = "log.csv"


def qwen2_config(diffill_config: Any, causal: bool = False) -> Qwen2Config:
    """The Qwen2Config of a diffill model's shape, reading causally or (Dream's way) both ways."""
    c = diffill_config
    config = Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or c.num_attention_heads,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings, pad_token_id=c.pad_token_id,
    )
    config.is_causal = causal
    return config


def as_qwen2(model: DiffillForInfilling, causal: bool = False) -> Qwen2ForCausalLM:
    """The same weights as transformers' Qwen2ForCausalLM (float32), q/k/v biases zero."""
    config = model.config
    qwen2 = Qwen2ForCausalLM(qwen2_config(config, causal))
    source = {name: tensor.float() for name, tensor in model.state_dict().items()}
    kv_width = (config.num_key_value_heads or config.num_attention_heads) * (config.hidden_size
                                                                              // config.num_attention_heads)
    state = {"model.embed_tokens.weight": source["embed_tokens.weight"], "model.norm.weight": source["norm.weight"]}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = source["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = source[ours + "attn.qkv_proj.weight"].split([config.hidden_size, kv_width, kv_width])
        gate, up = source[ours + "mlp.gate_up_proj.weight"].split(config.intermediate_size)
        state.update({
            theirs + "self_attn.q_proj.weight": q, theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": source[ours + "attn.o_proj.weight"],
            theirs + "self_attn.q_proj.bias": torch.zeros(q.shape[0]),
            theirs + "self_attn.k_proj.bias": torch.zeros(kv_width),
            theirs + "self_attn.v_proj.bias": torch.zeros(kv_width),
            theirs + "mlp.gate_proj.weight": gate, theirs + "mlp.up_proj.weight": up,
            theirs + "mlp.down_proj.weight": source[ours + "mlp.down_proj.weight"],
            theirs + "input_layernorm.weight": source[ours + "attn_norm.weight"],
            theirs + "post_attention_layernorm.weight": source[ours + "mlp_norm.weight"],
        })
    missing, unexpected = qwen2.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"the weights do not map onto Qwen2's: missing {sorted(missing)}, unexpected {unexpected}")
    qwen2.tie_weights()
    return qwen2


def save_dream_layout(qwen2: Qwen2ForCausalLM, tokenizer: Any, diffill_config: Any, destination: Path) -> Path:
    """Write the model as a Dream-family checkpoint (bfloat16, Qwen2's tensor names, `model_type` "Dream") with its
    tokenizer and the embedded model's mask and pad ids and own sampler settings; written beside the destination and
    renamed into place."""
    from infill_engine.training.export import write_model_directory

    def write(staging: Path) -> None:
        from safetensors.torch import save_file

        tied = qwen2.config.tie_word_embeddings
        weights = {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in qwen2.state_dict().items()
                   if not (tied and name == "lm_head.weight")}
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        c = qwen2.config
        config = {
            "architectures": ["DreamModel"], "model_type": "Dream", "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "hidden_act": "silu",
            "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": diffill_config.rope_theta, "tie_word_embeddings": tied,
            "pad_token_id": diffill_config.pad_token_id, "mask_token_id": diffill_config.mask_token_id,
            "torch_dtype": "bfloat16",
        }
        sampler = getattr(diffill_config, "diffill_sampler", None)
        if sampler:
            config["diffill_sampler"] = sampler
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tokenizer.save_pretrained(staging)

    return write_model_directory(Path(destination), write)


def bidirectional_loss(qwen2: Qwen2ForCausalLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The objective's span loss with every token attending every other: position p's logits from the output at
    p - 1, as Dream reads them (and the diffill model's shifted logits)."""
    logits = qwen2(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                   position_ids=batch["position_ids"]).logits  # (B, T, V): the output at t predicts t + 1
    shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # (B, T, V): position t's prediction
    labelled = batch["labels"] != IGNORE_INDEX  # (B, T)
    return masked_diffusion_loss(shifted[labelled][None], batch["labels"][labelled][None],
                                 batch["loss_weights"][labelled][None])


def fine_tune(
    init_from: Path, documents: list[Any], held_out: list[Any], out: Path, steps: int, lr: float = 3e-4,
    batch_size: int = 16, checkpoint_every: int = 250, seed: int = 24, bfloat16: bool | None = None,
    warmup_steps: int = 50, seq_len: int = 256, log: bool = True,
) -> list[Path]:
    """Fine-tune the diffill model at `init_from` read both ways on `documents` (one hole per window); checkpoints
    every `checkpoint_every` steps and at the end; returns their directories. Windows of `seq_len` tokens (at most the
    model's positions); `bfloat16`: autocast on the CPU (None: where the CPU has bfloat16 arithmetic, as `diffill
    train --precision auto`)."""
    from infill_engine.training.config import TrainConfig
    from infill_engine.training.train import cap_onednn_cache, lr_factor, make_optimizer, trains_in_bfloat16

    torch.manual_seed(seed)
    diffill = DiffillForInfilling.from_pretrained(init_from, dtype=torch.float32)
    config = diffill.config
    tokenizer = AutoTokenizer.from_pretrained(init_from)
    qwen2 = as_qwen2(diffill, causal=False)
    del diffill
    if bfloat16 is None:
        bfloat16 = trains_in_bfloat16(torch.device("cpu"), "auto")
    if bfloat16:
        cap_onednn_cache()
    objective = ObjectiveConfig(seq_len=min(seq_len, config.max_position_embeddings), holes=1)
    stream = ExampleStream(documents, tokenizer, objective, seed)
    fixed = held_out_batches(held_out or documents, tokenizer, objective, seed, batch_size, 4)
    # the embedded model's optimizer (AdamW, decay 0.1 on matrices) and schedule (warm-up, cosine to a tenth)
    optimizer = make_optimizer(qwen2, TrainConfig(run_dir=out, lr=lr), torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, steps, min_ratio=0.1))

    @torch.no_grad()
    def held_out_loss() -> float:
        qwen2.eval()
        value = sum(bidirectional_loss(qwen2, b).item() for b in fixed) / len(fixed)
        qwen2.train()
        return value

    out.mkdir(parents=True, exist_ok=True)
    saved, tokens, started = [], 0, time.monotonic()
    with open(out / LOG_FILE, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "tokens", "loss", "held_out_loss", "seconds"])
        writer.writerow([0, 0, "", round(held_out_loss(), 4), 0.0])
        qwen2.train()
        for step in range(1, steps + 1):
            batch = stream.batch(batch_size)
            tokens += int(batch["attention_mask"].sum())
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
                loss = bidirectional_loss(qwen2, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(qwen2.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            checkpoint = step % checkpoint_every == 0 or step == steps
            held = round(held_out_loss(), 4) if checkpoint else ""
            writer.writerow([step, tokens, round(loss.item(), 4), held, round(time.monotonic() - started, 1)])
            handle.flush()
            if log and (checkpoint or step % 10 == 0):
                print(f"step {step}/{steps} loss {loss.item():.4f}" + (f" held-out {held}" if held != "" else "")
                      + f" ({tokens / (time.monotonic() - started):.0f} tokens/s)", file=sys.stderr, flush=True)
            if checkpoint:
                saved.append(save_dream_layout(qwen2, tokenizer, config, out / f"step-{step:05d}"))
    return saved


def main(argv: list[str] | None = None) -> int:
    """The command line: fine-tune the embedded model (or --init-from) read both ways on a training run's corpus."""
    from infill_engine.loading import PACKAGED_MODEL
    from infill_engine.training.corpus import read_corpus

    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.dream_layout",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the checkpoints (step-N) and log.csv")
    parser.add_argument("--corpus", type=Path, required=True, help="a `diffill train` run directory (its corpus)")
    parser.add_argument("--init-from", type=Path, default=Path(PACKAGED_MODEL), help="a diffill model (default: "
                        "the embedded one)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.checkpoint_every < 1:
        parser.error("--steps, --batch-size and --checkpoint-every must be at least 1")
    if not (args.corpus / "corpus.jsonl").is_file():
        parser.error(f"{args.corpus} holds no corpus.jsonl: give a `diffill train` run directory")
    torch.set_num_threads(args.threads)
    corpus = read_corpus(args.corpus)
    fine_tune(args.init_from, corpus.split("train"), corpus.split("eval"), args.out, args.steps, args.lr,
              args.batch_size, args.checkpoint_every, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
