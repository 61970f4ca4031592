"""One GPU training run within a fixed wall-clock budget, from a bundle made by `gpu_bundle`, and its result packed.

    python3 -m infill_engine.training.gpu_run run --bundle .gpu-bundle --out "$OUT" --minutes 8.5 --dense
    python -m infill_engine.training.gpu_run unpack FILES_AT runs/gpu-1          (back here: reassemble the result)

`run` unpacks the bundle's corpus into a run directory beside the shipped tokenizer and trains with the ordinary
training loop (`train.train`) on CUDA, with batches built by worker processes (`batch_workers`). It trains twice:
a short probe that measures seconds per step, then a resume whose learning-rate schedule is sized to end at the
training deadline, so the cosine has decayed when the time is up. The time limit of the second part is a hard stop
with a checkpoint. The last checkpoint is exported as a diffill model directory (bfloat16) and, with time left,
scored on a sample of HumanEval infilling. Everything lands under --out:

    run.log             this run's log, written as it goes (it comes back even when the run is killed)
    train_log.csv       the loss log (step, tokens, loss, eval_loss, lr, seconds, eval_accuracy, eval_loss_average)
    summary.json        steps, tokens, throughput, parameters, timings, the evaluation's summary
    result.tar.NN       the model directory, train_log.csv and summary.json as one tar cut into parts of at most
                        15 MiB (the device tool returns at most 8 files of 16 MiB); `unpack` joins them
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infill_engine.training.train import TrainResult

logger = logging.getLogger("infill_engine.training.gpu_run")

PART_BYTES = 15 * (1 << 20)
MAX_PARTS = 4  # with run.log, train_log.csv, summary.json and eval.json: the tool's 8 files
PROBE_STEPS = 100  # steps of the first part, which measures the speed
WARMUP_STEPS = 200  # fixed, so that the probe and the resume share one schedule
EXPORT_SECONDS = 30.0  # kept free after training for the export and packing
SHIPPED_MODEL = Path(__file__).resolve().parents[1] / "model"


def use_wheels(directory: Path, target: Path) -> list[str]:
    """Unzip the bundle's wheels into `target` and put it first on sys.path and PYTHONPATH (no pip, no network)."""
    names = []
    for wheel in sorted(directory.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        names.append(wheel.name)
    if names:
        sys.path.insert(0, str(target))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    return names


def unpack_corpus(bundle: Path, run_dir: Path, tokenizer_from: Path) -> None:
    """Make `run_dir` a prepared run directory: corpus.jsonl and manifest.json from the bundle, and the tokenizer."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with lzma.open(bundle / "corpus.jsonl.xz", "rb") as source, open(run_dir / "corpus.jsonl", "wb") as target:
        shutil.copyfileobj(source, target, 1 << 22)
    shutil.copyfile(bundle / "manifest.json", run_dir / "manifest.json")
    (run_dir / "tokenizer").mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_from / name, run_dir / "tokenizer" / name)


def seconds_per_step(log_path: Path) -> float | None:
    """Seconds per optimizer step over the later two thirds of the loss log (the start includes warm-up costs)."""
    with open(log_path, newline="") as handle:
        rows = [(int(r["step"]), float(r["seconds"])) for r in csv.DictReader(handle)]
    if len(rows) < 2:
        return None
    first, last = rows[len(rows) // 3], rows[-1]
    if last[0] <= first[0]:
        first = rows[0]
    return (last[1] - first[1]) / max(last[0] - first[0], 1)


def pack_result(directory: Path, out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Tar `directory` and cut the tar into `out`/result.tar.NN parts of at most `part_bytes`."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "result.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(directory, arcname=".")
        parts = []
        with open(archive, "rb") as source:
            while chunk := source.read(part_bytes):
                part = out / f"result.tar.{len(parts):02d}"
                part.write_bytes(chunk)
                parts.append(part)
    if len(parts) > MAX_PARTS:
        logger.warning("the result takes %d parts; the device tool returns only 8 files", len(parts))
    return parts


def unpack_result(files_at: Path, destination: Path) -> Path:
    """Join result.tar.NN from `files_at` (searched recursively) and extract it into `destination`."""
    parts = sorted(Path(files_at).rglob("result.tar.[0-9][0-9]"))
    if not parts:
        raise FileNotFoundError(f"no result.tar.NN under {files_at}")
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "result.tar"
        with open(archive, "wb") as joined:
            for part in parts:
                joined.write(part.read_bytes())
        with tarfile.open(archive) as tar:
            tar.extractall(destination, filter="data")
    return destination


def _train_config(args: argparse.Namespace, run_dir: Path, sources: tuple[str, ...], **changes):
    """The TrainConfig of both parts; `changes` sets steps, stop step, time limit and resume."""
    from infill_engine.training.config import TrainConfig

    cuda = _cuda_available()
    workers = args.workers if args.workers is not None else (max(1, (os.cpu_count() or 2) - 2) if cuda else 0)
    return TrainConfig(
        run_dir=run_dir, sources=sources, use_stdlib=False, preset=args.preset, batch_size=args.batch_size,
        seq_len=args.seq_len, lr=args.lr, device=args.device, seed=args.seed,
        init_from=args.init_from, checkpoint_every=1_000_000, eval_every=args.eval_every,
        warmup_steps=min(WARMUP_STEPS, args.probe_steps * 2), num_threads=args.threads, progress=False,
        data_workers=workers, dense=args.dense, holes=args.holes, **{"log_every": 10, **changes},
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run(args: argparse.Namespace) -> int:
    """Train, export, evaluate and pack within args.minutes; 0 when a model was exported."""
    started = time.monotonic()
    deadline = started + 60 * args.minutes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().addHandler(handler)
    logging.getLogger("infill_engine.training").setLevel(logging.INFO)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the batch workers are forked; each tokenizes alone
    bundle = Path(args.bundle)
    work = Path(args.work or tempfile.mkdtemp(prefix="diffill-gpu-"))
    if args.init_from is not None and args.seq_len is None:  # a started model keeps the positions it was made for
        args.seq_len = json.loads((Path(args.init_from) / "config.json").read_text())["max_position_embeddings"]
    summary: dict = {"minutes": args.minutes, "preset": args.preset, "dense": args.dense,
                     "init_from": str(args.init_from) if args.init_from else None}
    summary["wheels"] = use_wheels(bundle / "wheels", work / "site")
    run_dir = work / "run"
    tokenizer_from = Path(args.init_from) if args.init_from else SHIPPED_MODEL
    unpack_corpus(bundle, run_dir, tokenizer_from)
    sources = tuple(json.loads((bundle / "manifest.json").read_text())["sources"])
    summary["unpacked_s"] = round(time.monotonic() - started, 1)
    logger.info("bundle unpacked into %s in %.1f s; wheels %s", run_dir, summary["unpacked_s"], summary["wheels"])

    import torch

    from infill_engine.training.train import count_parameters

    if torch.cuda.is_available():
        shm = shutil.disk_usage("/dev/shm").total / (1 << 30) if Path("/dev/shm").is_dir() else 0.0
        logger.info("device %s, torch %s, %d CPUs, /dev/shm %.1f GiB (the batch workers pass batches through it)",
                    torch.cuda.get_device_name(0), torch.__version__, os.cpu_count() or 0, shm)
        torch.backends.cuda.matmul.allow_tf32 = True
    train_deadline = deadline - args.reserve_seconds - 60 * args.eval_minutes
    result = train_until(args, run_dir, sources, train_deadline, summary)
    summary.update(steps=result.step, stopped_by=result.stopped_by, eval_loss=result.eval_loss,
                   tokens_per_second=result.tokens_per_second, trained_s=round(time.monotonic() - started, 1))
    shutil.copyfile(run_dir / "train_log.csv", out / "train_log.csv")

    from infill_engine.training.export import export_checkpoint

    result_dir = work / "result"
    result_dir.mkdir(exist_ok=True)
    model_dir = export_checkpoint(result.checkpoint, result_dir / "model")
    from transformers import AutoConfig

    from infill_engine.diffill_model import DiffillForInfilling

    summary["parameters"] = count_parameters(DiffillForInfilling(AutoConfig.from_pretrained(model_dir)))
    summary["model_bytes"] = sum(p.stat().st_size for p in model_dir.iterdir())
    summary["tokens"] = _last_tokens(out / "train_log.csv")
    logger.info("exported %s (%d parameters, %.1f MB)", model_dir, summary["parameters"], summary["model_bytes"] / 1e6)
    _write_summary(summary, out, result_dir)
    parts = pack_result(result_dir, out)  # packed before the evaluation: a timed-out evaluation loses only itself
    summary["parts"] = [p.name for p in parts]
    if args.eval_problems and deadline - time.monotonic() > 20:
        summary["eval"] = _evaluate(model_dir, bundle, out, args.eval_problems, deadline)
    summary["total_s"] = round(time.monotonic() - started, 1)
    _write_summary(summary, out, result_dir)
    logger.info("done in %.0f s: %s", summary["total_s"], json.dumps(summary))
    return 0


def train_until(args: argparse.Namespace, run_dir: Path, sources: tuple[str, ...], train_deadline: float,
                summary: dict) -> TrainResult:
    """Train in two parts: a probe that measures seconds per step, then a resume whose schedule ends at the deadline."""
    from infill_engine.training.config import PRESETS
    from infill_engine.training.train import train

    # part 1: a probe of a few steps with a provisional schedule, to measure the speed
    placeholder = args.steps or PRESETS[args.preset].steps
    probe = _train_config(args, run_dir, sources, steps=max(placeholder, args.probe_steps + 1),
                          stop_at_step=args.probe_steps, resume=False, log_every=max(1, args.probe_steps // 10),
                          time_limit_minutes=max(train_deadline - time.monotonic(), 1) / 60)
    part_start = time.monotonic()
    result = train(probe)
    probe_wall = time.monotonic() - part_start
    per_step = seconds_per_step(run_dir / "train_log.csv") or probe_wall / max(result.step, 1)
    summary["probe"] = {"steps": result.step, "wall_s": round(probe_wall, 1), "seconds_per_step": per_step,
                        "tokens_per_second": result.tokens_per_second}
    logger.info("probe: %d steps in %.1f s, %.4f s/step", result.step, probe_wall, per_step or 0)
    # part 2: resume with a schedule that ends at the training deadline; its time limit is the hard stop
    if result.stopped_by == "stop_at_step" and per_step:
        overhead = max(probe_wall - result.step * per_step, 0.0)  # startup: corpus, eval batches, workers
        left = train_deadline - time.monotonic() - overhead
        steps = args.steps or result.step + max(int(left / per_step), 1)
        summary["planned_steps"] = steps
        logger.info("resuming for %d steps in all (%.0f s left, %.0f s startup)", steps, left, overhead)
        result = train(_train_config(args, run_dir, sources, steps=steps, resume=True,
                                     time_limit_minutes=max(train_deadline - time.monotonic(), 1) / 60))
    return result


def _last_tokens(log_path: Path) -> int:
    with open(log_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return int(rows[-1]["tokens"]) if rows else 0


def _write_summary(summary: dict, out: Path, result_dir: Path) -> None:
    text = json.dumps(summary, indent=2, default=str) + "\n"
    (out / "summary.json").write_text(text)
    (result_dir / "summary.json").write_text(text)
    if (out / "train_log.csv").is_file():
        shutil.copyfile(out / "train_log.csv", result_dir / "train_log.csv")


def _evaluate(model_dir: Path, bundle: Path, out: Path, problems: int, deadline: float) -> dict:
    """`diffill eval humaneval-infill` on a spread sample, in a subprocess stopped at the deadline."""
    benches = sorted((bundle / "bench").glob("*.jsonl.gz"))
    if not benches:
        return {"skipped": "the bundle has no bench file"}
    command = [sys.executable, "-m", "diffill", "eval", "humaneval-infill", "--model", str(model_dir),
               "--data", str(benches[0]), "--sample", str(problems), "--protocol", "both",
               "--workers", str(max(1, (os.cpu_count() or 2) - 2)), "--out", str(out / "eval.json"), "--json"]
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 1),
                              env=env, cwd=repo)
    except subprocess.TimeoutExpired:
        logger.warning("the evaluation did not finish before the deadline")
        return {"skipped": "deadline"}
    logger.info("evaluation exit %d:\n%s%s", done.returncode, done.stdout, done.stderr[-4000:])
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"failed": done.returncode}


def main(argv: list[str] | None = None) -> int:
    """`run` (on the GPU machine) or `unpack` (back here)."""
    parser = argparse.ArgumentParser(prog="gpu_run", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="train, export and pack within a wall-clock budget")
    go.add_argument("--bundle", required=True, type=Path, help="a directory written by gpu_bundle")
    go.add_argument("--out", required=True, type=Path, help="where the result goes ($OUT on the GPU machine)")
    go.add_argument("--minutes", type=float, default=8.5, help="the whole run, export and evaluation included")
    go.add_argument("--reserve-seconds", type=float, default=EXPORT_SECONDS,
                    help=f"kept free after training for the export and packing (default: {EXPORT_SECONDS:g})")
    go.add_argument("--eval-minutes", type=float, default=0.0,
                    help="of those, kept for the evaluation after training (default: 0)")
    go.add_argument("--eval-problems", type=int, default=0,
                    help="HumanEval problems to score after the export, while time is left (default: 0, none)")
    go.add_argument("--preset", default="gpu", help="model size and batch shape (default: gpu)")
    go.add_argument("--init-from", type=Path, help="start from this diffill model (default: a new model)")
    go.add_argument("--dense", action="store_true", help="dense supervision (see diffill train --dense)")
    go.add_argument("--holes", type=int, default=1, help="holes per training window at most (see diffill train)")
    go.add_argument("--steps", type=int, help="the schedule's length (default: fitted to the time by the probe)")
    go.add_argument("--probe-steps", type=int, default=PROBE_STEPS, help="steps that measure the speed")
    go.add_argument("--batch-size", type=int)
    go.add_argument("--seq-len", type=int)
    go.add_argument("--lr", type=float)
    go.add_argument("--eval-every", type=int, default=250, help="steps between held-out losses (default: 250)")
    go.add_argument("--device", default="auto")
    go.add_argument("--workers", type=int, help="batch-building processes (default: CPUs - 2 on CUDA, 0 on CPU)")
    go.add_argument("--threads", type=int, default=2, help="torch CPU threads of the training process")
    go.add_argument("--seed", type=int, default=0)
    go.add_argument("--work", type=Path, help="scratch directory (default: a new temporary one)")
    back = commands.add_parser("unpack", help="join the result.tar parts fetched from $OUT and extract them")
    back.add_argument("files_at", type=Path)
    back.add_argument("destination", type=Path)
    args = parser.parse_args(argv)
    if args.command == "unpack":
        print(unpack_result(args.files_at, args.destination))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
