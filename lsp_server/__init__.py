"""diffill language server (built in a later issue)."""
