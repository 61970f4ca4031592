"""The projection of more training from a run's own curve (docs/MODEL.md)."""

from __future__ import annotations

import math

import pytest

from infill_engine.training.projection import fit_power_law, main, project


def test_a_power_law_curve_is_recovered_and_extended() -> None:
    # loss = 8 * tokens^-0.1: the fit finds the exponent, and a budget that doubles the tokens gives loss x 2^-0.1
    curve = [(t, 8 * t ** -0.1) for t in (1e6, 2e6, 4e6, 8e6)]
    law = fit_power_law([t for t, _ in curve], [v for _, v in curve])
    assert law.slope == pytest.approx(-0.1)
    rows = project(curve, [(4.0, 1.0), (3.0, 3.0)], tokens_per_second=8e6 / 3600, hours=[1.0])
    assert rows[0]["tokens"] == pytest.approx(16e6)
    assert rows[0]["loss"] == pytest.approx(8 * 16e6 ** -0.1)
    assert rows[0]["pass_at_1"] == pytest.approx(1.0 + 2.0 * (4.0 - rows[0]["loss"]))
    assert rows[0]["loss_per_doubling"] == pytest.approx(2 ** -0.1)


def test_bad_points_get_a_clear_error(capsys) -> None:
    assert main(["--curve", "1e6:3.0", "--pass", "3.0:1", "2.0:5", "--tokens-per-second", "100"]) == 2
    assert "at least two points" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--curve", "1e6-3.0", "--pass", "3:1", "--tokens-per-second", "1"])
    assert "A:B" in capsys.readouterr().err
    assert math.isfinite(project([(1e6, 4.0), (2e6, 3.8)], [(4.0, 1.0), (3.8, 2.0)], 100, [20])[0]["loss"])
