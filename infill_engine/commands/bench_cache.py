"""`diffill bench cache`: what one denoising step of a real-sized Dream-family model costs with and without the dual
cache, on random weights at the real model's shapes (nothing is downloaded).

The model is transformers' own Qwen2 built from the real checkpoint's config values with `is_causal=False`, which is
Dream's architecture: Dream, DiffuCoder and Open-dCoder are Qwen2.5 weights read bidirectionally. Each step is the
`dream` adapter's `predict` (`infill_engine.adapters.masked`), uncached and cached, so the figures are what the
engine pays per step. Benchmarks measure; tests never assert timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from infill_engine.commands import UsageError
from infill_engine.interface import DEVICES_HELP

REFRESH_EVERY = 4  # the refresh interval the amortised per-step figure assumes (Fast-dLLM: one per block)

# The shapes of real checkpoints, copied from their config.json files (source in each entry).
REAL_CONFIGS: dict[str, dict[str, Any]] = {
    # Open-dCoder 0.5B is Qwen2.5-Coder-0.5B continued as a masked-diffusion model (Open-dLLM README), so it has
    # Qwen2.5-Coder-0.5B's shapes: https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B/blob/main/config.json (the values
    # as read in copies of it, e.g. https://huggingface.co/GoidaAlignment/GOIDA-0.5B/blob/4ac79d1/config.json,
    # vocabulary from https://huggingface.co/osllmai-community/Qwen2.5-0.5B/blob/main/config.json).
    "open-dcoder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                             num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0,
                             tie_word_embeddings=True, max_position_embeddings=32768,
                             mask_token_id=151666, pad_token_id=151643),
    # DiffuCoder-7B-Instruct (Dream architecture, as Dream-v0 7B and Dream-Coder 7B):
    # https://huggingface.co/apple/DiffuCoder-7B-Instruct/blob/69c039ac2ceebecbb5d84e971d4d77f8adf0db32/config.json
    "dream-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, vocab_size=152064, rope_theta=1_000_000.0, tie_word_embeddings=False,
                     max_position_embeddings=131072, mask_token_id=151666, pad_token_id=151643),
}


def add_kinds(kinds: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `diffill bench cache`; kind name -> its run function."""
    cache = kinds.add_parser("cache", help="ms per denoising step with and without the dual cache, at a real "
                                           "Dream-family model's shapes (random weights)")
    cache.add_argument("--config", choices=sorted(REAL_CONFIGS), default="open-dcoder-0.5b",
                       help="whose shapes (default: open-dcoder-0.5b)")
    cache.add_argument("--context", type=int, default=1000, help="context tokens, 3/4 before the hole (default 1000)")
    cache.add_argument("--spans", type=int, nargs="+", default=[24, 64],
                       help="canvas positions (default: 24, the single-line canvas, and 64)")
    cache.add_argument("--batch", type=int, default=1, help="candidates per step (default 1)")
    cache.add_argument("--refresh-every", type=int, default=REFRESH_EVERY,
                       help=f"steps per refresh for the amortised figure (default {REFRESH_EVERY})")
    cache.add_argument("--repeats", type=int, default=2, help="timed uncached and cached steps (default 2)")
    cache.add_argument("--device", default="cpu", help=f"{DEVICES_HELP} (default: cpu)")
    cache.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                       help="(default: auto: as a bfloat16 checkpoint of these shapes loads; README, Assumptions)")
    cache.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    cache.add_argument("--json", action="store_true", help="print JSON")
    return {"cache": run_cache}


def run_cache(args: argparse.Namespace) -> int:
    """Build the random model, time uncached and cached steps per span, print the table (or JSON)."""
    import torch

    from infill_engine.device import choose_device, choose_dtype
    from infill_engine.loading import StoredWeights

    if args.context < 2 or args.batch < 1 or args.repeats < 1 or args.refresh_every < 1 or min(args.spans) < 1:
        raise UsageError("--context must be >= 2, and --batch, --repeats, --refresh-every and --spans >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = choose_device(args.device)
        # as `auto` loads a real checkpoint of these shapes, which is published in bfloat16
        dtype = choose_dtype(device, args.dtype, StoredWeights(real_parameters(args.config), "BF16"))
    except ValueError as error:
        raise UsageError(str(error)) from None
    model, special = build_random_dream(args.config, device, dtype)
    rows = [measure_span(model, special, args, span, device) for span in args.spans]
    report = {"config": args.config, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
              "threads": torch.get_num_threads(), "context": args.context, "batch": args.batch,
              "refresh_every": args.refresh_every, "parameters": sum(p.numel() for p in model.parameters()),
              "spans": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.config} shapes, random weights, {report['parameters'] / 1e9:.2f}B parameters, {report['device']} "
          f"{report['dtype']}, {report['threads']} threads, {args.context} context tokens, batch {args.batch}")
    every = f"every {args.refresh_every}"
    print(f"{'span':>5} {'clock':>5} {'uncached ms':>12} {'refresh ms':>11} {'cached ms':>10} {'x':>6} "
          f"{every + ' ms':>11} {'x':>6}")
    for row in rows:
        for clock, unit in (("wall", "ms"), ("cpu", "cpu_ms")):
            uncached, cached, amortised = (row[f"{kind}_{unit}"] for kind in ("uncached", "cached", "amortised"))
            print(f"{row['span']:>5} {clock:>5} {uncached:>12.1f} {row[f'refresh_{unit}']:>11.1f} {cached:>10.1f} "
                  f"{uncached / cached:>6.1f} {amortised:>11.1f} {uncached / amortised:>6.1f}")
    return 0


def real_parameters(name: str) -> int:
    """The parameter count of the named checkpoint's shapes (counted on the meta device: nothing is allocated)."""
    import torch

    model, _ = build_random_dream(name, torch.device("meta"), torch.float32)
    return sum(p.numel() for p in model.parameters())


def build_random_dream(name: str, device: Any, dtype: Any) -> tuple[Any, Any]:
    """transformers' Qwen2 at the named checkpoint's shapes, bidirectional, random weights; its special tokens."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from infill_engine.special_tokens import SpecialTokens

    values = dict(REAL_CONFIGS[name])
    mask_id, pad_id = values.pop("mask_token_id"), values.pop("pad_token_id")
    config = Qwen2Config(**values, pad_token_id=pad_id)
    config.is_causal = False  # Dream reads the sequence bidirectionally
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    special = SpecialTokens(mask_id=mask_id, end_of_span_ids=(pad_id,), pad_id=pad_id, bos_id=None, cls_id=None,
                            sep_id=None, ids_never_generated=(mask_id,))
    return model, special


def measure_span(model: Any, special: Any, args: argparse.Namespace, span: int, device: Any) -> dict[str, Any]:
    """Median wall and CPU ms of an uncached step, a refresh and a cached step at one canvas length."""
    import torch

    from infill_engine.adapters.masked import MaskedDenoiser

    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, special.mask_id, (args.context,), generator=generator).tolist()
    prefix, suffix = context[: args.context * 3 // 4], context[args.context * 3 // 4 :]
    canvas = torch.full((args.batch, span), special.mask_id, device=device)

    def timed(step: Callable[[], Any]) -> tuple[float, float]:
        """(wall ms, CPU ms of this process): on a shared machine the CPU time is the steadier figure."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000

    with torch.no_grad():
        plain = MaskedDenoiser(model, None, special, args.config, "dream", shift_logits=True)
        plain_context = plain.encode(prefix, suffix, span, args.batch)
        if device.type != "cpu":  # kernels and allocator warm; on CPU a 0.5B full step is too dear to spend twice
            plain.predict(plain_context, canvas)
        uncached = [timed(lambda: plain.predict(plain_context, canvas)) for _ in range(args.repeats)]
        # the first refresh of a model also runs the one-time probe, so it is not timed; then a refresh as each fill
        # has, then only cached steps (refresh_every exceeds the steps run)
        cached_denoiser = MaskedDenoiser(model, None, special, args.config, "dream", shift_logits=True,
                                         refresh_every=args.repeats + 2)
        cached_denoiser.predict(cached_denoiser.encode(prefix, suffix, span, args.batch), canvas)  # + the probe
        if not cached_denoiser.dual_cache.usable:
            raise UsageError("the dual cache turned itself off on this model (see the log); nothing to compare")
        cached_context = cached_denoiser.encode(prefix, suffix, span, args.batch)
        refresh = timed(lambda: cached_denoiser.predict(cached_context, canvas))  # a refresh as every fill has
        cached_denoiser.predict(cached_context, canvas)  # warm-up of the cached path
        cached = [timed(lambda: cached_denoiser.predict(cached_context, canvas)) for _ in range(args.repeats)]
    every = args.refresh_every
    row: dict[str, Any] = {"span": span}
    for index, unit in ((0, "ms"), (1, "cpu_ms")):
        uncached_ms = statistics.median(t[index] for t in uncached)
        cached_ms = statistics.median(t[index] for t in cached)
        row |= {f"uncached_{unit}": uncached_ms, f"refresh_{unit}": refresh[index], f"cached_{unit}": cached_ms,
                f"amortised_{unit}": (refresh[index] + (every - 1) * cached_ms) / every}
    return row


def main() -> int:
    """`python -m infill_engine.commands.bench_cache [options]`: the kind alone, without the rest of `diffill`
    (whose editor-side imports a bare GPU image may lack)."""
    parser = argparse.ArgumentParser(prog="bench_cache")
    kinds = parser.add_subparsers(dest="kind")
    run = add_kinds(kinds)["cache"]
    args = parser.parse_args(["cache", *sys.argv[1:]])
    try:
        return run(args)
    except UsageError as error:
        print(f"bench_cache: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
