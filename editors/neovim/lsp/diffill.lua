--- The diffill language server for `vim.lsp.config` / `vim.lsp.enable` (Neovim 0.11+).
---
--- `vim.lsp.enable('diffill')` alone uses the defaults; `require('diffill').setup(opts)` sets options and ghost text.
---@type vim.lsp.Config
return require('diffill').lsp_config()
