"""diffill's language server: `diffill serve` (see `lsp_server.server` for the handlers).

Importing it is cheap: torch and transformers are imported only on the model thread, when the model loads after
`initialized`, so `initialize` is answered at once.
"""
