--- Ghost text for Neovim 0.10 and 0.11, drawn with extmarks from `textDocument/inlineCompletion`.
---
--- While typing in insert mode, a request is sent `debounce_ms` after the last change; a newer change cancels the
--- pending request, and an answer that arrives after the buffer changed (its `changedtick` moved) or the cursor
--- moved is dropped. The first suggestion is drawn after the cursor: its first line inline, the others as virtual
--- lines. The accept key inserts it when one is shown and does what it did before otherwise (the user's mapping, kept
--- as a `<Plug>` mapping); `<Esc>` (leaving insert mode) and moving the cursor dismiss it. The invoke key asks at once
--- with `triggerKind` Invoked, which the server answers with several candidates (`completion.candidates`); pressed
--- again while one of them is shown, it shows the next. Neovim 0.12 and later use `vim.lsp.inline_completion`
--- instead, with the same accept key and fallback.

local util = require('diffill.util')

local M = {}

local METHOD = 'textDocument/inlineCompletion'
local ns = vim.api.nvim_create_namespace('diffill.ghost')

---@class diffill.Suggestion
---@field row integer 0-based row of the cursor when it was shown
---@field col integer byte column of the cursor when it was shown
---@field start_row integer 0-based start of the range the text replaces
---@field start_col integer
---@field end_row integer end of the range the text replaces (at least the cursor)
---@field end_col integer
---@field text string what replaces the range
---@field ghost string the part drawn after the cursor

---@class diffill.GhostState
---@field timer uv.uv_timer_t?
---@field client_id integer? the client of the pending request
---@field request_id integer? the pending request
---@field shown diffill.Suggestion?
---@field items diffill.Suggestion[]? the suggestions of the last answer, of which `shown` is number `index`
---@field index integer?
---@field attached boolean? whether the autocommands and the accept key are set
---@field keys table<string, diffill.KeyState>? the accept keys mapped in the buffer, by key
---@field own_change integer? the `changedtick` after a part of the ghost text was accepted (its rest stays shown)

---@class diffill.KeyState
---@field previous table what the key did before diffill mapped it (a `maparg()` dict; empty: not mapped)
---@field falling_back boolean? whether the keys of the user's mapping for the key are being run

---@type table<integer, diffill.GhostState>
M.buffers = {}

---@type diffill.GhostTextOpts
M.opts = {
  enabled = true,
  debounce_ms = 75,
  accept_key = '<Tab>',
  accept_word_key = false,
  accept_line_key = false,
  invoke_key = '<M-\\>',
  hl_group = 'DiffillGhostText',
}

---@param bufnr integer
---@return diffill.GhostState
local function state(bufnr)
  local st = M.buffers[bufnr]
  if st == nil then
    st = {}
    M.buffers[bufnr] = st
  end
  return st
end

--- Whether ghost text is shown in `bufnr` (the current buffer by default).
---@param bufnr integer?
---@return boolean
function M.visible(bufnr)
  local st = M.buffers[bufnr or vim.api.nvim_get_current_buf()]
  return st ~= nil and st.shown ~= nil
end

--- The ghost text shown in `bufnr`, or nil.
---@param bufnr integer?
---@return string?
function M.text(bufnr)
  local st = M.buffers[bufnr or vim.api.nvim_get_current_buf()]
  return st and st.shown and st.shown.ghost
end

--- Cancel the pending request of a buffer, if any.
---@param st diffill.GhostState
local function cancel(st)
  if st.timer then
    st.timer:stop()
  end
  if st.request_id and st.client_id then
    local client = vim.lsp.get_client_by_id(st.client_id)
    if client then
      util.cancel(client, st.request_id)
    end
  end
  st.request_id, st.client_id = nil, nil
end

--- Remove the ghost text of `bufnr` (and cancel its pending request).
---@param bufnr integer?
function M.dismiss(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.buffers[bufnr]
  if st == nil then
    return
  end
  cancel(st)
  st.shown, st.items, st.index = nil, nil, nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
end

--- The text of an inline completion item (a plain string or a snippet's value).
---@param item table
---@return string?
local function insert_text(item)
  local text = item.insertText
  if type(text) == 'table' then
    text = text.value
  end
  return type(text) == 'string' and text or nil
end

--- The items of an answer that can be drawn as text after the cursor, in the server's order.
---@param bufnr integer
---@param client vim.lsp.Client
---@param result table InlineCompletionList or InlineCompletionItem[]
---@param row integer
---@param col integer
---@return diffill.Suggestion[]
local function suggestions(bufnr, client, result, row, col)
  local found = {}
  for _, item in ipairs(result.items or result) do
    local text = insert_text(item)
    local start_row, start_col, end_row, end_col = row, col, row, col
    if item.range then
      local enc = client.offset_encoding
      start_row = item.range.start.line
      start_col = util.byte_col(bufnr, start_row, item.range.start.character, enc)
      end_row = item.range['end'].line
      end_col = util.byte_col(bufnr, end_row, item.range['end'].character, enc)
    end
    local before_cursor = start_row < row or (start_row == row and start_col <= col)
    local after_cursor = end_row > row or (end_row == row and end_col >= col)
    if text and text ~= '' and before_cursor and after_cursor then
      local typed = table.concat(vim.api.nvim_buf_get_text(bufnr, start_row, start_col, row, col, {}), '\n')
      if vim.startswith(text, typed) and #text > #typed then
        found[#found + 1] = {
          row = row,
          col = col,
          start_row = start_row,
          start_col = start_col,
          end_row = end_row,
          end_col = end_col,
          text = text,
          ghost = text:sub(#typed + 1),
        }
      end
    end
  end
  return found
end

--- Draw a suggestion after the cursor.
---@param bufnr integer
---@param s diffill.Suggestion
local function draw(bufnr, s)
  vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  local lines = vim.split(s.ghost, '\n', { plain = true })
  local hl = M.opts.hl_group
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], hl } }
  end
  vim.api.nvim_buf_set_extmark(bufnr, ns, s.row, s.col, {
    virt_text = { { lines[1], hl } },
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
end

--- Ask the server for ghost text at the cursor of the current window (which must show `bufnr`).
---@param bufnr integer
---@param invoked boolean? the user asked (triggerKind Invoked: several candidates), not typing (Automatic)
function M.request(bufnr, invoked)
  local st = state(bufnr)
  cancel(st)
  local win = vim.api.nvim_get_current_win()
  if vim.api.nvim_win_get_buf(win) ~= bufnr or not vim.api.nvim_get_mode().mode:match('^i') then
    return
  end
  local client = util.client(bufnr, METHOD)
  if client == nil then
    return
  end
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  ---@diagnostic disable-next-line: inject-field
  params.context = { triggerKind = invoked and 1 or 2 } -- Invoked or Automatic
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local cursor = vim.api.nvim_win_get_cursor(win)
  local request_id
  local ok, id = util.request(client, METHOD, params, function(err, result)
    if st.request_id == request_id then
      st.request_id, st.client_id = nil, nil
    end
    if err or result == nil or not vim.api.nvim_buf_is_valid(bufnr) then
      return
    end
    -- Stale: the buffer changed, the cursor moved or insert mode ended while the model ran.
    if vim.api.nvim_buf_get_changedtick(bufnr) ~= tick or vim.api.nvim_get_current_buf() ~= bufnr then
      return
    end
    local now = vim.api.nvim_win_get_cursor(0)
    if now[1] ~= cursor[1] or now[2] ~= cursor[2] or not vim.api.nvim_get_mode().mode:match('^i') then
      return
    end
    local found = suggestions(bufnr, client, result, cursor[1] - 1, cursor[2])
    local s = found[1]
    st.shown, st.items, st.index = s, found, 1
    if s then
      draw(bufnr, s)
    end
  end, bufnr)
  if ok then
    request_id = id
    st.request_id, st.client_id = id, client.id
  end
end

--- Schedule a request `debounce_ms` from now (a later call restarts the wait).
---@param bufnr integer
function M.schedule(bufnr)
  local st = state(bufnr)
  M.dismiss(bufnr)
  st.timer = st.timer or vim.uv.new_timer()
  st.timer:start(M.opts.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_get_current_buf() == bufnr then
      M.request(bufnr)
    end
  end))
end

--- The invoke key: show the next of several suggestions when one is shown, else ask for suggestions at once.
---@param bufnr integer?
function M.invoke(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = state(bufnr)
  if st.shown and st.items and #st.items > 1 then
    st.index = st.index % #st.items + 1
    st.shown = st.items[st.index]
    draw(bufnr, st.shown)
    return
  end
  M.dismiss(bufnr)
  M.request(bufnr, true)
end

--- Insert the shown ghost text; returns whether there was one.
---@param bufnr integer?
---@return boolean
function M.accept(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local st = M.buffers[bufnr]
  local s = st and st.shown
  if s == nil then
    return false
  end
  M.dismiss(bufnr)
  local lines = vim.split(s.text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, s.start_row, s.start_col, s.end_row, s.end_col, lines)
  local row = s.start_row + #lines - 1
  local col = (#lines == 1 and s.start_col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  return true
end

--- The next word of ghost text: the white space before it, then a run of word characters (letters, digits, `_`
--- and any non-ASCII character) or a run of other characters, as VS Code's "Accept Next Word" takes it.
---@param ghost string
---@return string
function M.next_word(ghost)
  return ghost:match('^%s*[%w_\128-\255]+') or ghost:match('^%s*[^%w_%s\128-\255]+') or ghost
end

--- The next line of ghost text: the line breaks before it, then the text up to the next line break (not included).
---@param ghost string
---@return string
function M.next_line(ghost)
  return ghost:match('^\n*[^\n]*')
end

--- Insert the first part of the shown ghost text (`part(ghost)`) at the cursor and keep showing the rest, with no new
--- request; the whole of it, or none shown, is `accept()`. Returns whether a suggestion was shown.
---@param bufnr integer
---@param part fun(ghost: string): string
---@return boolean
local function accept_part(bufnr, part)
  local st = M.buffers[bufnr]
  local s = st and st.shown
  if s == nil then
    return false
  end
  local piece = part(s.ghost)
  if #piece >= #s.ghost or piece == '' then
    return M.accept(bufnr)
  end
  cancel(st)
  local lines = vim.split(piece, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, s.row, s.col, s.row, s.col, lines)
  local row = s.row + #lines - 1
  local col = (#lines == 1 and s.col or 0) + #lines[#lines]
  -- The range the suggestion replaces still starts where it did; its end moves with the text after the cursor.
  if s.end_row == s.row then
    s.end_col = col + (s.end_col - s.col)
  end
  s.end_row = s.end_row + #lines - 1
  s.row, s.col, s.ghost = row, col, s.ghost:sub(#piece + 1)
  st.items, st.index = { s }, 1
  st.own_change = vim.api.nvim_buf_get_changedtick(bufnr)
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  draw(bufnr, s)
  return true
end

--- Insert the next word of the shown ghost text and keep showing the rest; returns whether there was one.
---@param bufnr integer?
---@return boolean
function M.accept_word(bufnr)
  return accept_part(bufnr or vim.api.nvim_get_current_buf(), M.next_word)
end

--- Insert the next line of the shown ghost text and keep showing the rest; returns whether there was one.
---@param bufnr integer?
---@return boolean
function M.accept_line(bufnr)
  return accept_part(bufnr or vim.api.nvim_get_current_buf(), M.next_line)
end

--- Whether a `maparg()` dict is one of diffill's own accept mappings.
---@param map table
---@return boolean
local function ours(map)
  return map.buffer == 1 and type(map.desc) == 'string' and vim.startswith(map.desc, 'diffill: accept')
end

--- The `<Plug>` mappings of an accept key's fallback: the user's mapping it replaced, and the mark after its keys.
---@param name string the key's name in them: accept, accept-word or accept-line
---@return string fallback, string fallen_back
local function plugs(name)
  return ('<Plug>(diffill-%s-fallback)'):format(name), ('<Plug>(diffill-%s-fallen-back)'):format(name)
end

--- Keep what `key` did in insert mode before diffill maps it in `bufnr`: the user's mapping is copied, with all its
--- flags and its script context, to a buffer-local `<Plug>` mapping. Returns the keys that do it: that `<Plug>`, or
--- `key` itself when it was not mapped.
---@param key string
---@param name string
---@param bufnr integer
---@return string
local function keep_previous(key, name, bufnr)
  local st = state(bufnr)
  st.keys = st.keys or {}
  local previous = vim.fn.maparg(key, 'i', false, true) --[[@as table]]
  if ours(previous) then
    -- attached again: what was there before diffill was captured the first time
    previous = st.keys[key] and st.keys[key].previous or {}
  end
  st.keys[key] = { previous = previous }
  if previous.callback == nil and (previous.rhs or '') == '' then
    return key
  end
  local fallback = plugs(name)
  local copy = vim.deepcopy(previous)
  copy.lhs = fallback
  copy.lhsraw = vim.api.nvim_replace_termcodes(fallback, true, true, true)
  copy.lhsrawalt = nil
  copy.buffer = 1
  vim.api.nvim_buf_call(bufnr, function()
    vim.fn.mapset('i', false, copy)
  end)
  return fallback
end

--- Map an accept key in `bufnr`: `accept()` returns the keys that accept (a part of) the shown suggestion, or nil
--- when none is shown; then the key does what it did before diffill mapped it (the same code on every Neovim version).
---@param bufnr integer
---@param key string|false
---@param name string the key's name in its `<Plug>` mappings (see plugs)
---@param accept fun(): string?
---@param desc string
local function map_accept(bufnr, key, name, accept, desc)
  if not key then
    return
  end
  local fallback = keep_previous(key, name, bufnr)
  local ks = state(bufnr).keys[key]
  local _, fallen_back = plugs(name)
  if fallback ~= key then
    -- Marks the end of the keys of the user's mapping (a macro or typeahead may hold another `key` after them).
    vim.keymap.set('i', fallen_back, function()
      ks.falling_back = nil
    end, { buffer = bufnr, desc = 'diffill: end of the fallback of ' .. key })
  end
  -- remap, so that the fallback `<Plug>` is mapped; a result that starts with `key` does not map it again.
  vim.keymap.set('i', key, function()
    if ks.falling_back then
      -- The user's mapping gave the key back (`imap <expr> <Tab> ... : '<Tab>'`): the plain key, as Vim does for
      -- a mapping whose keys start with its own.
      return key
    end
    local keys = accept()
    if keys or fallback == key then
      return keys or key
    end
    ks.falling_back = true
    vim.schedule(function() -- should the keys fail before the end mark, once they are done
      ks.falling_back = nil
    end)
    return fallback .. fallen_back
  end, { buffer = bufnr, expr = true, remap = true, replace_keycodes = true, desc = desc })
end

--- Remove an accept key of `bufnr` and give back a buffer-local mapping it replaced.
---@param bufnr integer
---@param key string|false
---@param name string
local function unmap_accept(bufnr, key, name)
  if not key or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local fallback, fallen_back = plugs(name)
  pcall(vim.keymap.del, 'i', key, { buffer = bufnr })
  pcall(vim.keymap.del, 'i', fallback, { buffer = bufnr })
  pcall(vim.keymap.del, 'i', fallen_back, { buffer = bufnr })
  local ks = M.buffers[bufnr] and M.buffers[bufnr].keys and M.buffers[bufnr].keys[key]
  if ks and ks.previous.buffer == 1 then
    vim.api.nvim_buf_call(bufnr, function()
      vim.fn.mapset('i', false, ks.previous)
    end)
  end
end

--- The accept keys of the plugin's own ghost text: option, `<Plug>` name, what it calls, its description.
local ACCEPT_KEYS = {
  { 'accept_key', 'accept', 'accept', 'diffill: accept ghost text' },
  { 'accept_word_key', 'accept-word', 'accept_word', 'diffill: accept the next word of the ghost text' },
  { 'accept_line_key', 'accept-line', 'accept_line', 'diffill: accept the next line of the ghost text' },
}

--- Turn ghost text on for a buffer the diffill client attached to.
---@param bufnr integer
function M.attach(bufnr)
  if M.buffers[bufnr] and M.buffers[bufnr].attached then
    return
  end
  state(bufnr).attached = true
  local group = vim.api.nvim_create_augroup(('diffill.ghost.%d'):format(bufnr), { clear = true })
  vim.api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      local st = M.buffers[bufnr]
      if st and st.own_change == vim.api.nvim_buf_get_changedtick(bufnr) then
        return -- a part of the ghost text accepted: its rest is shown already
      end
      M.schedule(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd('CursorMovedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      local s = M.buffers[bufnr] and M.buffers[bufnr].shown
      local cursor = vim.api.nvim_win_get_cursor(0)
      if s and (cursor[1] - 1 ~= s.row or cursor[2] ~= s.col) then
        M.dismiss(bufnr)
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.dismiss(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufWipeout', 'LspDetach' }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.event == 'LspDetach' and (vim.lsp.get_client_by_id(args.data.client_id) or {}).name ~= util.NAME then
        return
      end
      M.detach(bufnr)
    end,
  })
  for _, k in ipairs(ACCEPT_KEYS) do
    local option, name, fn, desc = unpack(k)
    map_accept(bufnr, M.opts[option], name, function()
      return M.visible(bufnr) and ('<Cmd>lua require("diffill.ghost").%s()<CR>'):format(fn) or nil
    end, desc)
  end
  if M.opts.invoke_key then
    vim.keymap.set('i', M.opts.invoke_key, function()
      M.invoke(bufnr)
    end, { buffer = bufnr, desc = 'diffill: ask for ghost text (several candidates), or show the next' })
  end
end

--- Turn ghost text off for a buffer.
---@param bufnr integer
function M.detach(bufnr)
  M.dismiss(bufnr)
  local st = M.buffers[bufnr]
  if st and st.timer then
    st.timer:close()
  end
  for _, k in ipairs(ACCEPT_KEYS) do
    unmap_accept(bufnr, M.opts[k[1]], k[2])
  end
  if M.opts.invoke_key then
    pcall(vim.keymap.del, 'i', M.opts.invoke_key, { buffer = bufnr })
  end
  M.buffers[bufnr] = nil
  pcall(vim.api.nvim_del_augroup_by_name, ('diffill.ghost.%d'):format(bufnr))
end

--- Ghost text with Neovim's own inline completion (0.12+): enabled per buffer; the accept key accepts the shown
--- completion, and does what it did before (the user's own mapping, or the key itself) when none is shown. Neovim
--- accepts a completion whole, so the word and line keys are not mapped on this path.
---@param bufnr integer
---@param client vim.lsp.Client
function M.attach_native(bufnr, client)
  local inline = vim.lsp.inline_completion
  inline.enable(true, { bufnr = bufnr, client_id = client.id })
  map_accept(bufnr, M.opts.accept_key, 'accept', function()
    return inline.get({ bufnr = bufnr }) and '' or nil
  end, 'diffill: accept inline completion')
end

--- Set the options and the highlight group.
---@param opts diffill.GhostTextOpts
function M.setup(opts)
  M.opts = opts
  vim.api.nvim_set_hl(0, 'DiffillGhostText', { default = true, link = 'Comment' })
end

return M
