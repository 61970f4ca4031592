"""The embedded model's cheaper denoising steps (issue 12) give the same fills: the rotary embedding in fewer
operators is the rotate-half formula bit for bit, the steps of one plan (a keys/values buffer written in place each
step) do not leak into each other or into the context's cache, and greedy fills through the planned steps are those
of the plain training-style forward pass over the whole sequence."""

from __future__ import annotations

import pytest
import torch

from infill_engine.adapters.diffill import DiffillDenoiser
from infill_engine.diffill_model.modeling_diffill import apply_rotary, rotary_cos_sin
from infill_engine.engine import InfillEngine
from infill_engine.interface import EngineOptions, ModelSpec
from infill_engine.request import InfillRequest
from tests import tiny_models
from infill_engine.diffill_model import DiffillForInfilling
from tests.test_diffill_model import full_forward_canvas_logits, make_request, model  # noqa: F401 - fixture
from tests.test_diffill_model import tiny_config


def rotate_half_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (B, H, T, D) rotated the textbook way: x * cos + cat(-x2, x1) * sin, angles repeated over both halves."""
    D = x.shape[-1]
    inv_freq = theta ** -(torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, D)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()


def test_rotary_in_fewer_operators_is_the_rotate_half_formula_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 16, generator=g)  # (B, H, T, D)
    positions = torch.randint(0, 1000, (2, 9), generator=g)
    cos, sin = rotary_cos_sin(positions, 16, 10_000.0, torch.float32)  # (B, T, 1, D)
    rotated = apply_rotary(x.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.equal(rotated, rotate_half_reference(x, positions, 10_000.0))


def test_steps_of_one_plan_leak_nothing_into_the_next_step_or_the_context_cache(model) -> None:  # noqa: F811
    request = make_request(batch=2, prefix=7, canvas=5, suffix=4)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    keys_before = [k.clone() for k in cache.keys]
    plan = model.plan_denoising(request["canvas_positions"], cache)
    other = torch.flip(request["canvas_ids"], dims=[1])
    first = model.denoise_planned(request["canvas_ids"], plan)
    between = model.denoise_planned(other, plan)
    again = model.denoise_planned(request["canvas_ids"], plan)
    assert torch.equal(first, again)
    assert torch.equal(between, model.denoise(other, request["canvas_positions"], cache))
    assert all(torch.equal(k, before) for k, before in zip(cache.keys, keys_before))
    torch.testing.assert_close(first, full_forward_canvas_logits(model, request), atol=1e-5, rtol=0)


def test_a_plan_refuses_a_canvas_of_another_shape(model) -> None:  # noqa: F811
    request = make_request(batch=1, prefix=4, canvas=5, suffix=2)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    plan = model.plan_denoising(request["canvas_positions"], cache)
    with pytest.raises(ValueError, match="a plan for canvases"):
        model.denoise_planned(request["canvas_ids"][:, :3], plan)


class WholeSequenceDenoiser(DiffillDenoiser):
    """The reference: every step one training-style pass over prefix, canvas and suffix (no cache, no plan)."""

    reuses_canvas_keys = False

    @torch.no_grad()
    def predict(self, context, canvas, self_conditioning=None, columns=None):  # noqa: ANN001, ANN201
        B, N = canvas.shape
        prefix = torch.tensor(context.prefix_ids, dtype=torch.long)
        suffix = torch.tensor(context.suffix_ids, dtype=torch.long)
        ids = torch.cat([prefix.expand(B, -1), canvas, suffix.expand(B, -1)], dim=1)  # (B, P + N + S)
        canvas_mask = torch.zeros_like(ids, dtype=torch.bool)
        canvas_mask[:, len(prefix) : len(prefix) + N] = True
        logits = self.model(input_ids=ids, canvas_mask=canvas_mask).logits  # positions 0..T-1: the same layout
        logits = logits[:, len(prefix) : len(prefix) + N].float()  # (B, N, V)
        return logits if columns is None else logits[:, columns]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> InfillEngine:
    return InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path_factory.mktemp("diffill")))))


@pytest.mark.parametrize("candidates", [1, 2])
def test_greedy_fills_through_planned_steps_are_those_of_the_whole_sequence_pass(engine, candidates) -> None:
    """Exact where every pass runs the whole canvas (canvas_refresh 0; the keys kept between steps are not)."""
    engine = engine.with_options(EngineOptions(canvas_refresh=0))
    denoiser = engine.denoiser
    reference = engine.with_denoiser(WholeSequenceDenoiser(denoiser.model, denoiser.tokenizer, denoiser.special,
                                                           denoiser.path))
    requests = [
        InfillRequest("def add(a, b):\n    return ", "\n", language="python", max_tokens=8, candidates=candidates),
        InfillRequest("for i in range(10):\n    print(", ")\n", language="python", max_tokens=12,
                      candidates=candidates, single_line=True),
    ]
    for request in requests:
        planned, whole = engine.fill(request), reference.fill(request)
        assert texts(planned) == texts(whole)
        assert planned.stats.forward_passes == whole.stats.forward_passes


def texts(result) -> tuple[list[str], list[str]]:
    """Every candidate's text, shown or rejected by the syntax gate (a random tiny model's are rejected)."""
    return [c.text for c in result.candidates], [c.text for c in result.rejected]


@pytest.mark.parametrize("rows, positions, expected", [(1, 24, 1), (2, 64, 2)])
def test_a_small_step_runs_on_one_thread_and_the_configured_count_comes_back(tmp_path, rows, positions, expected):
    """A single-line step is a few rows of matrix work, faster on one thread than split over two; a batch of long
    canvases keeps the configured threads. Either way the setting is what it was after the step."""
    denoiser = InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path / "m")))).denoiser
    seen = []
    planned = denoiser.model.denoise_planned

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return planned(*args, **kwargs)

    denoiser.model.denoise_planned = record
    configured = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        context = denoiser.encode([5, 6, 7, 8], [9, 10], positions, rows)
        denoiser.predict(context, torch.full((rows, positions), denoiser.special.mask_id))
        assert seen == [expected] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(configured)


# ----------------------------------------------------- canvas keys and values kept between steps (canvas_refresh)

@pytest.fixture(params=[False, True], ids=["same-position", "shift-logits"])
def either_model(request):
    """The tiny model both ways its logits can sit: at the position itself, or one after (shift_logits, causal
    context: what the embedded model ships with)."""
    config = tiny_config()
    config.shift_logits = request.param
    config.causal_context = request.param
    torch.manual_seed(0)
    return DiffillForInfilling(config).eval()


@pytest.mark.parametrize("columns, rows", [([0, 3, 7], [3]), ([5, 6], [6]), ([1, 2, 8], [0, 8])])
def test_a_pass_over_some_rows_of_the_canvas_last_read_gives_the_whole_pass_logits(either_model, columns, rows):
    """The keys and values a step wrote for a position are still right while its token and the canvas are unchanged:
    a pass over a few rows then gives the logits of a pass over all of them."""
    model = either_model
    request = make_request(batch=2, prefix=6, canvas=9, suffix=3)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    plan = model.plan_denoising(request["canvas_positions"], cache)
    columns, rows = torch.tensor(columns), torch.tensor(rows)
    whole = model.denoise_planned(request["canvas_ids"], plan, columns)
    some = model.denoise_planned(request["canvas_ids"], plan, columns, rows)
    assert some.shape == whole.shape == (2, len(columns), model.config.vocab_size)
    torch.testing.assert_close(some, whole, atol=1e-5, rtol=0)


def test_the_layers_run_over_the_rows_and_the_columns_sources_only(either_model):
    """What makes the step cheaper: the layers see the changed rows, plus (for a shift_logits model) the positions
    just before the columns, whose outputs are those columns' logits; a changed token is read."""
    model = either_model
    request = make_request(batch=1, prefix=5, canvas=12, suffix=2)
    cache = model.encode_context(request["context_ids"], request["context_positions"])
    plan = model.plan_denoising(request["canvas_positions"], cache)
    widths = []
    hook = model.layers[0].register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    try:
        columns = torch.tensor([4, 9])
        before = model.denoise_planned(request["canvas_ids"], plan, columns)
        changed = request["canvas_ids"].clone()
        changed[0, 4] = (int(changed[0, 4]) + 1) % (model.config.vocab_size - 3)
        after = model.denoise_planned(changed, plan, columns, torch.tensor([4]))
    finally:
        hook.remove()
    expected = 3 if model.config.shift_logits else 2  # rows {4} and sources {3, 8} or {4, 9}
    assert widths == [12, expected]
    assert not torch.allclose(after, before)  # the new token at 4 is attended to
    C = cache.length
    reference = model.plan_denoising(request["canvas_positions"], cache)
    model.denoise_planned(changed, reference)  # a whole pass over the changed canvas
    # The first layer's keys of a position depend on its token alone: position 4's are now the new token's ...
    torch.testing.assert_close(plan.keys[0][:, :, C + 4], reference.keys[0][:, :, C + 4], atol=1e-6, rtol=0)
    # ... and a position outside the pass keeps what the pass before wrote, though position 4 changed under it.
    kept_before = model.plan_denoising(request["canvas_positions"], cache)
    model.denoise_planned(request["canvas_ids"], kept_before)
    assert torch.equal(plan.keys[1][:, :, C + 10], kept_before.keys[1][:, :, C + 10])
    assert not torch.allclose(plan.keys[1][:, :, C + 10], reference.keys[1][:, :, C + 10])


def test_canvas_rows_are_not_used_without_columns_or_on_a_new_plan(tmp_path):
    """`rows` is only an approximation once a pass has written every position: a fresh plan (a new canvas shape)
    and a pass that needs every logit run the whole canvas."""
    denoiser = InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path / "m")))).denoiser
    context = denoiser.encode([5, 6, 7, 8], [9, 10], 6, 1)
    canvas = torch.full((1, 6), denoiser.special.mask_id)
    whole = denoiser.predict(context, canvas)
    fresh = denoiser.encode([5, 6, 7, 8], [9, 10], 6, 1)
    first = denoiser.predict(fresh, canvas, columns=torch.tensor([2, 3]), rows=torch.tensor([2]))
    torch.testing.assert_close(first, whole[:, [2, 3]], atol=1e-5, rtol=0)
    again = denoiser.predict(fresh, canvas, rows=torch.tensor([2]))  # no columns: every logit, every row
    torch.testing.assert_close(again, whole, atol=1e-5, rtol=0)
