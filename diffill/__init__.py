"""The `diffill` command: the top of the house, where every subcommand is known.

    diffill.cli          the command table: fill, doctor, bench, eval, train, serve, engine
    lsp_server           the language server (no torch at start-up)
    infill_engine        the engine (knows nothing of editors); infill_engine.training only for `diffill train`
"""
