-- Minimal init for the headless Neovim tests: only diffill.nvim on the runtimepath, the real `diffill serve`.
-- $DIFFILL_MODEL names the checkpoint; $DIFFILL_ENGINE_FACTORY (screenshots only) a scripted engine instead.
local root = assert(vim.env.DIFFILL_ROOT, 'DIFFILL_ROOT is not set')
vim.opt.runtimepath:prepend(root .. '/editors/neovim')
vim.o.showmode = false
vim.o.swapfile = false
vim.o.shada = ''
vim.lsp.log.set_level(vim.log.levels.WARN)

local cmd = { assert(vim.env.DIFFILL_SERVER, 'DIFFILL_SERVER is not set'), 'serve' }
local settings = { engine = { mode = 'inprocess' } } -- no detached engine outlives a test
if vim.env.DIFFILL_ENGINE_FACTORY then
  vim.list_extend(cmd, { '--engine-factory', vim.env.DIFFILL_ENGINE_FACTORY })
else
  settings.model = { path = assert(vim.env.DIFFILL_MODEL, 'DIFFILL_MODEL is not set') }
end

-- a scenario's own init may set more ghost-text options first (partial_init.lua)
local ghost_text = vim.tbl_extend('force', { debounce_ms = 50 }, vim.g.diffill_test_ghost_text or {})
require('diffill').setup({ cmd = cmd, ghost_text = ghost_text, settings = settings })
