"""`diffill doctor`: the device, dtype, model, tokenizer and grammars this machine would use, and whether each loads."""

from __future__ import annotations

import argparse
import json

from infill_engine.commands import UsageError
from infill_engine.interface import add_model_options, model_spec_from_args

HELP = "show the device, dtype, model, tokenizer and grammars in use"


def add_arguments(doctor: argparse.ArgumentParser) -> None:
    """The options of `diffill doctor`."""
    add_model_options(doctor)
    doctor.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 when every part is healthy, 1 otherwise."""
    from infill_engine.doctor import diagnose

    try:
        spec = model_spec_from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    report = diagnose(spec.path, spec.family, spec.device, spec.dtype, spec.trust_remote_code,
                      compiled_layers=spec.compiled_layers)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for section, values in report.items():
            print(f"{section}:")
            for key, value in values.items():
                print(f"  {key}: {value}")
    healthy = all(values.get("ok", True) for values in report.values())
    return 0 if healthy else 1
