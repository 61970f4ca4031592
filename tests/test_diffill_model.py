"""Tests of the embedded infilling model: exact context cache, attention rule, training loss, loading."""

import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForMaskedLM

import infill_engine.diffill_model as diffill_model
from infill_engine.diffill_model import DiffillConfig, DiffillContextCache, DiffillForInfilling
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX

VOCAB = 100
ATOL = 1e-5


def tiny_config() -> DiffillConfig:
    """A 2-layer, 32-wide model; the special ids sit at the top of the vocabulary."""
    return DiffillConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        mask_token_id=VOCAB - 1,
        end_of_span_token_id=VOCAB - 2,
        pad_token_id=VOCAB - 3,
    )


@pytest.fixture
def model() -> DiffillForInfilling:
    torch.manual_seed(0)
    return DiffillForInfilling(tiny_config()).eval()


def ordinary_tokens(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Random ids below the special tokens."""
    return torch.randint(0, VOCAB - 3, shape, generator=generator)


def make_request(batch: int, prefix: int, canvas: int, suffix: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Context (prefix then suffix) and a half-masked canvas, with the explicit positions of the brief."""
    g = torch.Generator().manual_seed(seed)
    config = tiny_config()
    canvas_ids = ordinary_tokens(batch, canvas, generator=g)
    canvas_ids[:, ::2] = config.mask_token_id
    prefix_pos = torch.arange(prefix)
    canvas_pos = torch.arange(prefix, prefix + canvas)
    suffix_pos = torch.arange(prefix + canvas, prefix + canvas + suffix)
    return {
        "context_ids": ordinary_tokens(batch, prefix + suffix, generator=g),
        "context_positions": torch.cat([prefix_pos, suffix_pos]).expand(batch, -1).clone(),
        "canvas_ids": canvas_ids,
        "canvas_positions": canvas_pos.expand(batch, -1).clone(),
    }


def full_forward_canvas_logits(
    model: DiffillForInfilling, request: dict[str, torch.Tensor], context_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Canvas logits (B, N, V) from one training-style pass over concat(context, canvas)."""
    ctx, canvas = request["context_ids"], request["canvas_ids"]
    B, C = ctx.shape
    N = canvas.shape[1]
    canvas_mask = torch.cat([torch.zeros(B, C, dtype=torch.bool), torch.ones(B, N, dtype=torch.bool)], dim=1)
    attention_mask = None
    if context_padding_mask is not None:
        attention_mask = torch.cat([context_padding_mask, torch.ones(B, N, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        out = model(
            input_ids=torch.cat([ctx, canvas], dim=1),
            position_ids=torch.cat([request["context_positions"], request["canvas_positions"]], dim=1),
            canvas_mask=canvas_mask,
            attention_mask=attention_mask,
        )
    return out.logits[:, C:]


def cached_canvas_logits(
    model: DiffillForInfilling, request: dict[str, torch.Tensor], context_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Canvas logits (B, N, V) from encode_context then one denoise step."""
    cache = model.encode_context(request["context_ids"], request["context_positions"], context_padding_mask)
    return model.denoise(request["canvas_ids"], request["canvas_positions"], cache)


# ---- the cache is exact -------------------------------------------------------------------------------------


def test_cached_denoise_equals_full_forward(model: DiffillForInfilling) -> None:
    request = make_request(batch=2, prefix=7, canvas=5, suffix=4)
    cached = cached_canvas_logits(model, request)
    assert cached.shape == (2, 5, VOCAB)
    torch.testing.assert_close(cached, full_forward_canvas_logits(model, request), atol=ATOL, rtol=0)


def test_cached_denoise_equals_forward_in_natural_order(model: DiffillForInfilling) -> None:
    """Training on prefix|canvas|suffix sequences matches inference with the context passed as prefix+suffix."""
    P, N, S = 6, 4, 5
    request = make_request(batch=2, prefix=P, canvas=N, suffix=S)
    ctx = request["context_ids"]
    input_ids = torch.cat([ctx[:, :P], request["canvas_ids"], ctx[:, P:]], dim=1)
    canvas_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    canvas_mask[:, P : P + N] = True
    with torch.no_grad():
        logits = model(input_ids, torch.arange(P + N + S).expand(2, -1), canvas_mask=canvas_mask).logits
    torch.testing.assert_close(cached_canvas_logits(model, request), logits[:, P : P + N], atol=ATOL, rtol=0)


def test_cached_denoise_equals_full_forward_with_context_padding(model: DiffillForInfilling) -> None:
    request = make_request(batch=3, prefix=6, canvas=4, suffix=5)
    padding_mask = torch.ones(3, 11, dtype=torch.bool)
    padding_mask[1, :4] = False  # left padding before a short prefix
    padding_mask[2, 6:8] = False  # padding between prefix and suffix
    request["context_ids"][~padding_mask] = tiny_config().pad_token_id
    cached = cached_canvas_logits(model, request, padding_mask)
    assert torch.isfinite(cached).all()
    torch.testing.assert_close(cached, full_forward_canvas_logits(model, request, padding_mask), atol=ATOL, rtol=0)


def test_padding_tokens_are_attended_by_nobody(model: DiffillForInfilling) -> None:
    request = make_request(batch=1, prefix=6, canvas=4, suffix=3)
    padding_mask = torch.ones(1, 9, dtype=torch.bool)
    padding_mask[0, :2] = False
    before = cached_canvas_logits(model, request, padding_mask)
    request["context_ids"][0, :2] = (request["context_ids"][0, :2] + 1) % (VOCAB - 3)
    torch.testing.assert_close(cached_canvas_logits(model, request, padding_mask), before, atol=0, rtol=0)
    # Without the padding mask the same change is seen, so the assertion above is not vacuous.
    assert not torch.allclose(cached_canvas_logits(model, request), before, atol=ATOL)


def test_batch_one_cache_serves_a_batch_of_candidates(model: DiffillForInfilling) -> None:
    request = make_request(batch=1, prefix=5, canvas=6, suffix=4)
    candidates = make_request(batch=3, prefix=5, canvas=6, suffix=4, seed=1)["canvas_ids"]
    positions = request["canvas_positions"].expand(3, -1)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    logits = model.denoise(candidates, positions, cache)
    assert cache.batch_size == 1 and logits.shape == (3, 6, VOCAB)
    repeated = {
        "context_ids": request["context_ids"].expand(3, -1),
        "context_positions": request["context_positions"].expand(3, -1),
        "canvas_ids": candidates,
        "canvas_positions": positions,
    }
    torch.testing.assert_close(logits, full_forward_canvas_logits(model, repeated), atol=ATOL, rtol=0)


def test_batch_one_padded_cache_serves_a_batch_of_candidates(model: DiffillForInfilling) -> None:
    request = make_request(batch=1, prefix=5, canvas=3, suffix=4)
    padding_mask = torch.ones(1, 9, dtype=torch.bool)
    padding_mask[0, :2] = False
    candidates = make_request(batch=3, prefix=5, canvas=3, suffix=4, seed=2)["canvas_ids"]
    positions = request["canvas_positions"].expand(3, -1)
    cache = model.encode_context(request["context_ids"], request["context_positions"], padding_mask)
    logits = model.denoise(candidates, positions, cache)
    repeated = {
        "context_ids": request["context_ids"].expand(3, -1),
        "context_positions": request["context_positions"].expand(3, -1),
        "canvas_ids": candidates,
        "canvas_positions": positions,
    }
    expected = full_forward_canvas_logits(model, repeated, padding_mask.expand(3, -1))
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_denoise_rejects_a_cache_of_another_batch(model: DiffillForInfilling) -> None:
    request = make_request(batch=2, prefix=4, canvas=3, suffix=2)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    with pytest.raises(ValueError, match="batch"):
        model.denoise(request["canvas_ids"].repeat(2, 1), request["canvas_positions"].repeat(2, 1), cache)


# ---- the attention rule -------------------------------------------------------------------------------------


def test_context_is_unaffected_by_the_canvas(model: DiffillForInfilling) -> None:
    """In the one-pass forward, context outputs do not depend on canvas tokens; denoise never writes the cache."""
    request = make_request(batch=2, prefix=5, canvas=4, suffix=3)
    C = request["context_ids"].shape[1]
    input_ids = torch.cat([request["context_ids"], request["canvas_ids"]], dim=1)
    positions = torch.cat([request["context_positions"], request["canvas_positions"]], dim=1)
    canvas_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    canvas_mask[:, C:] = True
    other_ids = input_ids.clone()
    other_ids[:, C:] = (other_ids[:, C:] + 7) % VOCAB
    with torch.no_grad():
        a = model(input_ids, positions, canvas_mask=canvas_mask).logits
        b = model(other_ids, positions, canvas_mask=canvas_mask).logits
        unmasked = model(other_ids, positions).logits  # plain bidirectional: the context does see the canvas
    torch.testing.assert_close(a[:, :C], b[:, :C], atol=0, rtol=0)
    assert not torch.allclose(a[:, C:], b[:, C:], atol=ATOL)
    assert not torch.allclose(a[:, :C], unmasked[:, :C], atol=ATOL)

    cache = model.encode_context(request["context_ids"], request["context_positions"])
    keys_before = [k.clone() for k in cache.keys]
    values_before = [v.clone() for v in cache.values]
    model.denoise(request["canvas_ids"], request["canvas_positions"], cache)
    model.denoise(other_ids[:, C:], request["canvas_positions"], cache)
    for before, after in zip(keys_before + values_before, cache.keys + cache.values):
        torch.testing.assert_close(after, before, atol=0, rtol=0)


@pytest.mark.parametrize("part", ["prefix", "suffix"])
def test_context_tokens_condition_the_canvas(model: DiffillForInfilling, part: str) -> None:
    P = 5
    request = make_request(batch=1, prefix=P, canvas=4, suffix=4)
    before = cached_canvas_logits(model, request)
    changed = slice(0, P) if part == "prefix" else slice(P, None)
    request["context_ids"][:, changed] = (request["context_ids"][:, changed] + 11) % (VOCAB - 3)
    assert not torch.allclose(cached_canvas_logits(model, request), before, atol=1e-3)


def test_cache_holds_per_layer_keys_and_values(model: DiffillForInfilling) -> None:
    request = make_request(batch=2, prefix=5, canvas=3, suffix=4)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    assert isinstance(cache, DiffillContextCache)
    assert len(cache.keys) == len(cache.values) == 2
    assert cache.keys[0].shape == cache.values[0].shape == (2, 2, 9, 16)  # (B, H, C, D)
    assert cache.padding_mask is None and cache.length == 9


def test_no_canvas_mask_means_plain_bidirectional_attention(model: DiffillForInfilling) -> None:
    ids = ordinary_tokens(2, 9, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(ids).logits
        all_canvas = model(ids, canvas_mask=torch.ones_like(ids, dtype=torch.bool)).logits
    torch.testing.assert_close(plain, all_canvas, atol=ATOL, rtol=0)


# ---- training -----------------------------------------------------------------------------------------------


def training_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two prefix|canvas|suffix sequences, the second right-padded, labels on the masked canvas positions."""
    g = torch.Generator().manual_seed(seed)
    config = tiny_config()
    input_ids = ordinary_tokens(2, 12, generator=g)
    canvas_mask = torch.zeros(2, 12, dtype=torch.bool)
    canvas_mask[:, 4:8] = True
    attention_mask = torch.ones(2, 12, dtype=torch.bool)
    attention_mask[1, 10:] = False
    input_ids[~attention_mask] = config.pad_token_id
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, 4:7] = input_ids[:, 4:7]
    input_ids[:, 4:7] = config.mask_token_id
    return {
        "input_ids": input_ids,
        "position_ids": torch.arange(12).expand(2, -1),
        "canvas_mask": canvas_mask,
        "attention_mask": attention_mask,
        "labels": labels,
    }


def test_training_loss_is_finite_and_reaches_the_embedding(model: DiffillForInfilling) -> None:
    model.train()
    out = model(**training_batch())
    assert out.loss is not None and torch.isfinite(out.loss)
    out.loss.backward()
    grad = model.get_input_embeddings().weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_loss_is_mean_cross_entropy_over_labelled_positions(model: DiffillForInfilling) -> None:
    batch = training_batch()
    out = model(**batch)
    labelled = batch["labels"] != IGNORE_INDEX
    expected = F.cross_entropy(out.logits[labelled], batch["labels"][labelled])
    torch.testing.assert_close(out.loss, expected)
    # The ignored positions really carry other tokens, so counting them would change the loss.
    assert (~labelled).any()
    everywhere = F.cross_entropy(out.logits.flatten(0, 1), batch["input_ids"].flatten())
    assert not torch.allclose(out.loss, everywhere)


def test_loss_weights_scale_each_position(model: DiffillForInfilling) -> None:
    batch = training_batch()
    plain = model(**batch).loss
    doubled = model(**batch, loss_weights=torch.full((2, 12), 2.0)).loss
    torch.testing.assert_close(doubled, 2 * plain)

    weights = torch.rand(2, 12, generator=torch.Generator().manual_seed(4)) + 0.5
    weights[batch["labels"] == IGNORE_INDEX] = float("inf")  # MDLM's 1/t may be infinite where nothing is labelled
    out = model(**batch, loss_weights=weights)
    labelled = batch["labels"] != IGNORE_INDEX
    per_token = F.cross_entropy(out.logits[labelled], batch["labels"][labelled], reduction="none")
    torch.testing.assert_close(out.loss, (per_token * weights[labelled]).sum() / labelled.sum())


def test_loss_without_labelled_positions_is_zero(model: DiffillForInfilling) -> None:
    batch = training_batch()
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    assert model(**batch).loss.item() == 0.0


def test_gradient_checkpointing_gives_the_same_gradients(model: DiffillForInfilling) -> None:
    batch = training_batch()
    model.train()
    model(**batch).loss.backward()
    plain = model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    model.activation_checkpointing_enable()
    assert all(block.gradient_checkpointing for block in model.layers)
    model(**batch).loss.backward()
    torch.testing.assert_close(model.embed_tokens.weight.grad, plain, atol=1e-6, rtol=1e-5)


# ---- loading ------------------------------------------------------------------------------------------------


def test_save_and_auto_load_round_trip(model: DiffillForInfilling, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "diffill"
    loaded, info = AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is DiffillForInfilling
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    assert loaded.config.mask_token_id == model.config.mask_token_id
    request = make_request(batch=2, prefix=4, canvas=3, suffix=3)
    torch.testing.assert_close(cached_canvas_logits(loaded, request), cached_canvas_logits(model, request))


def test_bfloat16_load_runs(model: DiffillForInfilling, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    request = make_request(batch=2, prefix=6, canvas=4, suffix=3)
    padding_mask = torch.ones(2, 9, dtype=torch.bool)
    padding_mask[1, :2] = False
    logits = cached_canvas_logits(loaded, request, padding_mask)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    torch.testing.assert_close(logits.float(), cached_canvas_logits(model, request, padding_mask), atol=0.05, rtol=0)
    batch = training_batch()
    assert torch.isfinite(loaded(**batch).loss)


def test_registration_survives_a_second_import() -> None:
    importlib.reload(diffill_model)
    assert type(AutoModelForMaskedLM.from_config(tiny_config())).__name__ == "DiffillForInfilling"


@pytest.mark.parametrize("chunk", [256, 3])  # one chunk, and several with a remainder (`output_loss.CHUNK`)
@pytest.mark.parametrize("dense", [False, True])  # the span alone, and next-token supervision of the context too
def test_loss_only_gives_the_same_loss_and_gradients(chunk, dense, monkeypatch):
    from infill_engine.diffill_model import output_loss

    monkeypatch.setattr(output_loss, "CHUNK", chunk)
    torch.manual_seed(0)
    model = DiffillForInfilling(DiffillConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, intermediate_size=64,
                                              causal_context=dense, shift_logits=dense))
    ids = torch.randint(0, 50, (2, 12))
    canvas = torch.zeros(2, 12, dtype=torch.bool)
    canvas[:, 4:8] = True
    labels = torch.where(canvas, ids, torch.full_like(ids, -100))
    weights = torch.rand(2, 12) + 0.5
    extra = {"next_token_labels": torch.where(canvas, -100, ids), "next_token_weight": 0.7} if dense else {}
    full = model(ids, canvas_mask=canvas, labels=labels, loss_weights=weights, **extra).loss
    full.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    fast = model(ids, canvas_mask=canvas, labels=labels, loss_weights=weights, loss_only=True, **extra).loss
    fast.backward()
    assert torch.allclose(full, fast, atol=1e-6)
    assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, model.parameters()))
    model.zero_grad(set_to_none=True)
    model.lm_head.weight.requires_grad_(False)  # a frozen output layer (and embeddings): the rest learns as before
    model(ids, canvas_mask=canvas, labels=labels, loss_weights=weights, loss_only=True, **extra).loss.backward()
    assert model.lm_head.weight.grad is None
    assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, model.parameters()) if p.requires_grad)
    model.lm_head.weight.requires_grad_(True)
    with torch.no_grad():  # evaluation: the losses alone
        assert torch.allclose(model(ids, canvas_mask=canvas, labels=labels, loss_weights=weights, loss_only=True,
                                    **extra).loss, full, atol=1e-6)


def test_the_chunked_loss_under_bfloat16_autocast_is_the_whole_logits_one():
    from infill_engine.diffill_model.output_loss import CHUNK, output_cross_entropy

    generator = torch.Generator().manual_seed(1)
    rows = 2 * CHUNK + 37  # chunks and a remainder
    hidden = torch.randn(rows, 32, generator=generator)
    weight = (torch.randn(512, 32, generator=generator) * 0.3).requires_grad_()
    targets = torch.randint(0, 512, (rows,), generator=generator)
    scale = torch.rand(rows, generator=generator) + 0.5
    results = []
    for chunked in (False, True):
        inputs = hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if chunked:
                loss = output_cross_entropy(inputs, weight, targets, scale)
            else:
                loss = (F.cross_entropy(F.linear(inputs, weight).float(), targets, reduction="none") * scale).sum()
        loss.backward()
        results.append((loss.detach(), inputs.grad, weight.grad.clone()))
        weight.grad = None
    (whole, whole_hidden, whole_weight), (chunked, chunked_hidden, chunked_weight) = results
    assert chunked.dtype == torch.float32 and torch.allclose(chunked, whole, rtol=1e-5)
    assert ((chunked_hidden - whole_hidden).norm() / whole_hidden.norm()).item() < 1e-2  # bfloat16's rounding
    assert ((chunked_weight - whole_weight).norm() / whole_weight.norm()).item() < 1e-2
