"""`diffill serve` as a build that ships no embedded model: `python -m tests.lsp.serve_without_model [options]`."""

import sys

import infill_engine.loading
from diffill.cli import main

infill_engine.loading.default_model_path = lambda: None  # what a wheel without infill_engine/model sees
sys.exit(main(["serve", *sys.argv[1:]]))
