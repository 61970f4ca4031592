-- Unit tests of diffill.nvim's own logic, run with `nvim --headless --clean -l unit.lua` (no server involved).
-- Prints "N passed, N failed" and exits non-zero on a failure.
local T = dofile(assert(vim.env.DIFFILL_ROOT) .. '/tests/editors/nvim/units.lua')
local test, eq = T.test, T.eq

local config = require('diffill.config')
local status = require('diffill.status')
local rewrite = require('diffill.rewrite')

test('setup options merge over the defaults; lists are replaced', function()
  local options = config.merge({ cmd = { '/venv/bin/diffill', 'serve', '-v' }, settings = { completion = { candidates = 4 } } })
  eq(options.cmd, { '/venv/bin/diffill', 'serve', '-v' })
  eq(options.settings.completion.candidates, 4)
  eq(options.settings.completion.maxTokens, 64)
  eq(options.ghost_text.accept_key, '<Tab>')
  eq(config.defaults.settings.completion.candidates, 2)
end)

test('the statusline shows model, latency and tokens per forward pass', function()
  eq(status.statusline(), '')
  status.last = { model = 'diffill:m', ms = 41.4, forward_passes = 9, tokens_per_forward = 2.33, state = 'ready' }
  eq(status.statusline(), 'diffill:m 41ms 2.3t/f')
  status.last = { model = 'diffill:m', ms = 0.2, cache_hit = true, forward_passes = 0, state = 'ready' }
  eq(status.statusline(), 'diffill:m 0ms cached')
  status.last = { model = '', ms = 1, state = 'loading' }
  eq(status.statusline(), 'diffill loading')
end)

local buf = vim.api.nvim_create_buf(false, true)
vim.api.nvim_set_current_buf(buf)
vim.api.nvim_buf_set_lines(buf, 0, -1, false, { 'a = 1', 'b = "é😀x"', 'c = 3' })

test('a linewise range ends at the start of the next line', function()
  eq(rewrite.range(buf, { line1 = 1, line2 = 2 }, 'utf-16'),
    { start = { line = 0, character = 0 }, ['end'] = { line = 2, character = 0 } })
end)

test('a linewise range over the last line ends at its end, in the position encoding', function()
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { 'a = 1', 'b = "é😀x"' })
  -- b = "é😀x" is 9 characters, 10 UTF-16 units (the emoji is a surrogate pair), 13 bytes
  eq(rewrite.range(buf, { line1 = 2, line2 = 2 }, 'utf-16')['end'], { line = 1, character = 10 })
  eq(rewrite.range(buf, { line1 = 2, line2 = 2 }, 'utf-8')['end'], { line = 1, character = 13 })
  eq(rewrite.range(buf, { line1 = 2, line2 = 2 }, 'utf-32')['end'], { line = 1, character = 9 })
end)

test('a charwise visual selection keeps its columns, its last character included', function()
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { 'a = 1', 'b = "é😀x"', 'c = 3' })
  vim.api.nvim_win_set_cursor(0, { 2, 5 }) -- on é
  vim.cmd('normal! vl\27') -- select é and the emoji
  local range = rewrite.range(buf, { line1 = 2, line2 = 2 }, 'utf-16')
  eq(range, { start = { line = 1, character = 5 }, ['end'] = { line = 1, character = 8 } })
end)

test('LSP character offsets map to byte columns in every encoding', function()
  local util = require('diffill.util')
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { 'b = "é😀x"' })
  -- after the emoji: 8 UTF-16 units, 7 code points, 11 bytes
  eq(util.byte_col(buf, 0, 8, 'utf-16'), 11)
  eq(util.byte_col(buf, 0, 7, 'utf-32'), 11)
  eq(util.byte_col(buf, 0, 11, 'utf-8'), 11)
  eq(util.byte_col(buf, 0, 99, 'utf-16'), 13) -- past the end: the end of the line
end)

T.finish()
