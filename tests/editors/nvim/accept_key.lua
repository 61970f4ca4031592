-- The accept key's fallback, run with `nvim --headless --clean -l accept_key.lua` (no server involved): with no
-- ghost text shown, <Tab> does what the user's own insert-mode <Tab> mapping did before diffill mapped it, whatever
-- kind of mapping that was, on both of the plugin's paths (its own ghost text, and Neovim 0.12's
-- vim.lsp.inline_completion, stood in for here on every version: the tests need to say whether one is shown).
-- Prints "N passed, N failed" and exits non-zero on a failure.
local T = dofile(assert(vim.env.DIFFILL_ROOT) .. '/tests/editors/nvim/units.lua')
local test, eq = T.test, T.eq

local ghost = require('diffill.ghost')
ghost.setup(vim.deepcopy(require('diffill.config').defaults.ghost_text))

-- Neovim 0.12's inline completion, as the plugin uses it: enable() per buffer, get() accepts the shown completion
-- and says whether there was one.
local native = vim.lsp.inline_completion
local stand_in = { shown = false, accepted = 0 }
function stand_in.enable() end
function stand_in.get()
  if stand_in.shown then
    stand_in.accepted = stand_in.accepted + 1
  end
  return stand_in.shown
end

--- Attach diffill to a fresh buffer (its own ghost text, or the native path), type `keys` in insert mode there and
--- return the buffer's text; `before(bufnr)` makes the user's mappings first.
---@param path 'ghost'|'native'
---@param before fun(bufnr: integer)
---@param keys string?
---@return string
local function type_with(path, before, keys)
  local bufnr = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_set_current_buf(bufnr)
  before(bufnr)
  if path == 'native' then
    vim.lsp.inline_completion = stand_in
    ghost.attach_native(bufnr, { id = 1 })
  else
    ghost.attach(bufnr)
  end
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes('i' .. (keys or '<Tab>z') .. '<Esc>', true, true, true), 'x', false)
  local text = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), '\n')
  if path == 'native' then
    vim.lsp.inline_completion = native
  else
    ghost.detach(bufnr)
  end
  pcall(vim.keymap.del, 'i', '<Tab>')
  return text
end

for _, path in ipairs({ 'ghost', 'native' }) do
  test(path .. ': with no mapping, <Tab> is a tab', function()
    eq(type_with(path, function() end), '\tz')
  end)

  test(path .. ': a Lua expr mapping runs, its keys replaced', function()
    eq(type_with(path, function()
      vim.keymap.set('i', '<Tab>', function()
        return 'x<BS>lua'
      end, { expr = true })
    end), 'luaz')
  end)

  test(path .. ': a Lua expr mapping without replace_keycodes gets its keys as they are', function()
    eq(type_with(path, function()
      vim.keymap.set('i', '<Tab>', function()
        return '<BS>'
      end, { expr = true, replace_keycodes = false })
    end), '<BS>z')
  end)

  test(path .. ': a Lua callback runs, before the keys typed after <Tab>', function()
    eq(type_with(path, function()
      vim.keymap.set('i', '<Tab>', function()
        vim.api.nvim_put({ 'cb' }, 'c', false, true)
      end)
    end), 'cbz')
  end)

  test(path .. ': a Vim script expr mapping reaches its <SID> function', function()
    eq(type_with(path, function()
      local script = vim.fn.tempname() .. '.vim' -- a script of its own, as in a vimrc
      vim.fn.writefile({ 'function! s:Tab() abort', '  return "vim"', 'endfunction',
        'inoremap <expr> <Tab> <SID>Tab()' }, script)
      vim.cmd.source(script)
    end), 'vimz')
  end)

  test(path .. ': a recursive mapping reaches a <Plug> mapping', function()
    eq(type_with(path, function()
      vim.cmd([[
        inoremap <Plug>(user-tab) plugged
        imap <Tab> <Plug>(user-tab)
      ]])
    end), 'pluggedz')
  end)

  test(path .. ': a noremap mapping is not remapped, a remap one is', function()
    vim.cmd('inoremap ab ZZ')
    local noremap = type_with(path, function()
      vim.cmd('inoremap <Tab> ab')
    end)
    local remap = type_with(path, function()
      vim.cmd('imap <Tab> ab')
    end)
    vim.cmd('iunmap ab')
    eq({ noremap, remap }, { 'abz', 'ZZz' })
  end)

  test(path .. ': a recursive mapping that gives <Tab> back gets a tab, each time', function()
    local calls = 0
    eq({
      type_with(path, function()
        vim.keymap.set('i', '<Tab>', function()
          calls = calls + 1
          return calls == 2 and '<Plug>(user-tab)' or '<Tab>'
        end, { expr = true, remap = true })
        vim.keymap.set('i', '<Plug>(user-tab)', 'p')
      end, '<Tab><Tab><Tab>z'),
      calls,
    }, { '\tp\tz', 3 })
    pcall(vim.keymap.del, 'i', '<Plug>(user-tab)')
  end)

  test(path .. ': a Vim script expr mapping in the style of vim-vsnip falls through to a tab', function()
    eq(type_with(path, function()
      vim.cmd([[imap <expr> <Tab> 0 ? '<Plug>(vsnip-jump-next)' : '<Tab>']])
    end), '\tz')
  end)

  test(path .. ': a buffer-local mapping wins over a global one', function()
    eq(type_with(path, function(bufnr)
      vim.keymap.set('i', '<Tab>', 'global')
      vim.keymap.set('i', '<Tab>', 'local', { buffer = bufnr })
    end), 'localz')
  end)
end

test('ghost: detach gives a buffer-local mapping back', function()
  local bufnr = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_set_current_buf(bufnr)
  vim.keymap.set('i', '<Tab>', 'mine', { buffer = bufnr, desc = 'user tab' })
  ghost.attach(bufnr)
  eq(vim.fn.maparg('<Tab>', 'i', false, true).desc, 'diffill: accept ghost text')
  ghost.detach(bufnr)
  local map = vim.fn.maparg('<Tab>', 'i', false, true)
  eq({ map.rhs, map.desc, map.buffer }, { 'mine', 'user tab', 1 })
  eq(vim.fn.maparg('<Plug>(diffill-accept-fallback)', 'i'), '')
end)

test('native: a shown completion is accepted and the user mapping does not run', function()
  local calls = 0
  stand_in.shown = true
  local text = type_with('native', function()
    vim.keymap.set('i', '<Tab>', function()
      calls = calls + 1
      return 'user'
    end, { expr = true })
  end)
  stand_in.shown = false
  eq({ text, calls }, { 'z', 0 })
end)

test('native: attaching again keeps the first captured mapping', function()
  local bufnr = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_set_current_buf(bufnr)
  vim.keymap.set('i', '<Tab>', 'first')
  vim.lsp.inline_completion = stand_in
  ghost.attach_native(bufnr, { id = 1 })
  ghost.attach_native(bufnr, { id = 1 }) -- the client restarted
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes('i<Tab><Esc>', true, true, true), 'x', false)
  vim.lsp.inline_completion = native
  vim.keymap.del('i', '<Tab>')
  eq(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), { 'first' })
end)

T.finish()
