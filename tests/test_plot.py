"""`python -m infill_engine.training.plot`: the model card's loss curve from a run's loss log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infill_engine.training.loss_log import LOG_FILE, append_log
from infill_engine.training.plot import held_out_series, main, read_log


def _run_dir(tmp_path: Path) -> Path:
    """A run directory whose loss log has rows with and without an evaluation, as training writes them."""
    for step in range(1, 6):
        row = {"step": step, "tokens": 4096 * step, "loss": f"{6 - 0.5 * step:.4f}", "lr": "0.001", "seconds": "1.0"}
        if step % 2 == 0:
            row.update(eval_loss=f"{6.2 - 0.5 * step:.4f}", eval_accuracy=f"{0.05 * step:.4f}")
        append_log(tmp_path / LOG_FILE, row)
    return tmp_path


def test_the_log_is_read_with_numbers_and_missing_evaluations(tmp_path: Path) -> None:
    rows = read_log(_run_dir(tmp_path) / LOG_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["eval_loss"] is None and rows[1]["eval_loss"] == pytest.approx(5.2)
    assert rows[3]["eval_accuracy"] == pytest.approx(0.2)


def test_a_run_with_a_weight_average_draws_its_held_out_loss_too(tmp_path: Path) -> None:
    plain = read_log(_run_dir(tmp_path) / LOG_FILE)
    assert list(held_out_series(plain)) == ["held-out loss"]  # a log from before --ema: one curve
    append_log(tmp_path / LOG_FILE, {"step": 6, "tokens": 6 * 4096, "loss": "3.0", "lr": "0.001", "seconds": "1.0",
                                     "eval_loss": "3.3000", "eval_loss_average": "3.1000"})
    series = held_out_series(read_log(tmp_path / LOG_FILE))
    assert series["held-out loss"][-1] == pytest.approx((6 * 4096 / 1e6, 3.3))
    assert series["held-out loss, weight average"] == [pytest.approx((6 * 4096 / 1e6, 3.1))]


def test_without_matplotlib_the_command_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        main([str(_run_dir(tmp_path))])
    assert exit_info.value.code == 2
    assert "pip install 'diffill[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "loss.png").exists()


def test_a_missing_log_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2 and f"no loss log at {tmp_path / LOG_FILE}" in capsys.readouterr().err


def test_a_run_directory_becomes_a_png_beside_its_log(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    assert main([str(_run_dir(tmp_path)), "--title", "tiny"]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_are_compared_on_one_plot_with_pass_at_1_points(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    png = tmp_path / "compare.png"
    argv = ["--compare", f"span={first}", f"dense={second / LOG_FILE}", str(png),
            "--pass-at-1", "dense:0.02:3.5", "--reference", "shipped:3.3:1.8"]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--compare", "span", "out.png"], "expected LABEL=..."),
    (["--compare", "span=/nowhere", "out.png"], "no loss log at /nowhere"),
    (["--compare", "out.png"], "needs at least one LABEL=RUN"),
    (["--compare", "span=RUN", "out.png", "--pass-at-1", "dense"], "expected LABEL:..."),
])
def test_a_bad_comparison_is_a_usage_error(argv, message, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if "span=RUN" in argv:
        argv = [a.replace("RUN", str(_run_dir(tmp_path))) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
