-- Accepting a part of the ghost text, run with `nvim --headless --clean -l partial_accept.lua` (no server involved):
-- the word and line keys insert the next word or line of the shown suggestion and keep the rest shown; with none
-- shown they do what they did before. Prints "N passed, N failed" and exits non-zero on a failure.
local T = dofile(assert(vim.env.DIFFILL_ROOT) .. '/tests/editors/nvim/units.lua')
local test, eq = T.test, T.eq

local ghost = require('diffill.ghost')
local opts = vim.deepcopy(require('diffill.config').defaults.ghost_text)
opts.accept_word_key, opts.accept_line_key = '<C-Right>', '<S-Tab>'
ghost.setup(opts)

--- The words the word key takes from `text`, one after another.
local function words(text)
  local found = {}
  while text ~= '' do
    local word = ghost.next_word(text)
    found[#found + 1] = word
    text = text:sub(#word + 1)
  end
  return found
end

test('a word is the white space before it and a run of word characters or of other characters', function()
  eq(words('total / len(values)'), { 'total', ' /', ' len', '(', 'values', ')' })
  eq(words('  naïve_x = "é"'), { '  naïve_x', ' =', ' "', 'é', '"' })
  eq(words('x\n    return x'), { 'x', '\n    return', ' x' })
  eq(words('   '), { '   ' })
end)

test('a line is the line breaks before it and the text up to the next one', function()
  eq(ghost.next_line('a + b\n    return a'), 'a + b')
  eq(ghost.next_line('\n    return a\n'), '\n    return a')
  eq(ghost.next_line('\n\n'), '\n\n')
end)

--- What a user sees after each key: the buffer's lines, the cursor, the ghost text and its drawn first line.
local seen = {}
function _G.record()
  local marks = vim.api.nvim_buf_get_extmarks(0, vim.api.nvim_create_namespace('diffill.ghost'), 0, -1,
    { details = true })
  local drawn = marks[1] and marks[1][4].virt_text and marks[1][4].virt_text[1][1]
  seen[#seen + 1] = {
    lines = vim.api.nvim_buf_get_lines(0, 0, -1, false),
    cursor = vim.api.nvim_win_get_cursor(0),
    ghost = ghost.text() or vim.NIL,
    drawn = drawn or vim.NIL,
  }
end

--- Show `text` as ghost text at the cursor, as an answer of the server would; `after` characters after the cursor
--- are in the range it replaces (a closing bracket the suggestion writes again).
function _G.show(text, after)
  local bufnr = vim.api.nvim_get_current_buf()
  local cursor = vim.api.nvim_win_get_cursor(0)
  local row, col = cursor[1] - 1, cursor[2]
  local s = { row = row, col = col, start_row = row, start_col = col, end_row = row, end_col = col + (after or 0),
    text = text, ghost = text }
  ghost.buffers[bufnr].shown, ghost.buffers[bufnr].items, ghost.buffers[bufnr].index = s, { s }, 1
end

--- A fresh buffer holding `lines` with the plugin's ghost text attached; run `keys` (normal mode first) in it.
local function run(lines, keys)
  seen = {}
  local bufnr = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_set_current_buf(bufnr)
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, lines)
  ghost.attach(bufnr)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, true, true), 'xt', false)
  ghost.detach(bufnr)
  return seen
end

local R = '<Cmd>lua record()<CR>'

test('word by word, then line by line: each key inserts its part and the rest stays shown', function()
  local s = run({ '    result =' }, 'A <Cmd>lua show("total / len(values)\\n    return result")<CR>'
    .. '<C-Right>' .. R .. '<C-Right>' .. R .. '<S-Tab>' .. R .. '<S-Tab>' .. R .. '<Esc>')
  eq(s[1].lines, { '    result = total' })
  eq(s[1].cursor, { 1, 18 })
  eq(s[1].ghost, ' / len(values)\n    return result')
  eq(s[1].drawn, ' / len(values)') -- drawn after the new cursor, the second line as a virtual line
  eq({ s[2].lines, s[2].ghost }, { { '    result = total /' }, ' len(values)\n    return result' })
  eq({ s[3].lines, s[3].ghost, s[3].drawn }, { { '    result = total / len(values)' }, '\n    return result', '' })
  -- The last line is the whole rest: accepted like <Tab>, the ghost text gone, the cursor at its end.
  eq({ s[4].lines, s[4].cursor, s[4].ghost }, { { '    result = total / len(values)', '    return result' },
    { 2, 17 }, vim.NIL })
end)

test('after a part, <Tab> accepts the rest', function()
  local s = run({ 'x = ' }, 'A<Cmd>lua show("min(a, b)")<CR><C-Right>' .. R .. '<Tab>' .. R .. '<Esc>')
  eq({ s[1].lines, s[1].ghost }, { { 'x = min' }, '(a, b)' })
  eq({ s[2].lines, s[2].cursor, s[2].ghost }, { { 'x = min(a, b)' }, { 1, 13 }, vim.NIL })
end)

test('the text after the cursor that a suggestion replaces stays replaced once the rest is accepted', function()
  -- `total = sum(|)` with the suggestion `values)` replacing the `)` after the cursor
  local s = run({ 'total = sum()' }, '$i<Cmd>lua show("values)", 1)<CR><C-Right>' .. R .. '<Tab>' .. R .. '<Esc>')
  eq({ s[1].lines, s[1].ghost }, { { 'total = sum(values)' }, ')' })
  eq({ s[2].lines, s[2].cursor }, { { 'total = sum(values)' }, { 1, 19 } })
end)

test('with no ghost text shown, the word and line keys do what they did before', function()
  vim.keymap.set('i', '<C-Right>', '[word]')
  vim.keymap.set('i', '<S-Tab>', function()
    return '[line]'
  end, { expr = true })
  local s = run({ '' }, 'i<C-Right><S-Tab>' .. R .. '<Esc>')
  vim.keymap.del('i', '<C-Right>')
  vim.keymap.del('i', '<S-Tab>')
  eq(s[1].lines, { '[word][line]' })
end)

test('detach gives the word and line keys back', function()
  local bufnr = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_set_current_buf(bufnr)
  vim.keymap.set('i', '<S-Tab>', 'mine', { buffer = bufnr })
  ghost.attach(bufnr)
  eq(vim.fn.maparg('<C-Right>', 'i', false, true).desc, 'diffill: accept the next word of the ghost text')
  eq(vim.fn.maparg('<S-Tab>', 'i', false, true).desc, 'diffill: accept the next line of the ghost text')
  ghost.detach(bufnr)
  eq(vim.fn.maparg('<C-Right>', 'i'), '')
  eq(vim.fn.maparg('<S-Tab>', 'i'), 'mine')
  eq(vim.fn.maparg('<Plug>(diffill-accept-line-fallback)', 'i'), '')
end)

T.finish()
