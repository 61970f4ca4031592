-- Ghost text drops an answer for an older buffer: the server's answer for "alpha = " is held on its way to the plugin
-- (as if it were still in the pipe) while the user rewrites the line to "omega = ", which leaves the cursor where it
-- was; then it is delivered. It must not be drawn (the buffer's changedtick moved); the answer for "omega = " is.
-- Run with the server's engine built by tests/editors/rule_engine.py, on its TEXT.
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')
local ghost = require('diffill.ghost')

local LINE = 3 -- 1-based: "alpha ="
local METHOD = 'textDocument/inlineCompletion'
local ns = vim.api.nvim_create_namespace('diffill.ghost')

--- The texts of the ghost-text extmarks in the current buffer (what is on screen).
---@return string[]
local function drawn()
  local texts = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
    for _, chunk in ipairs(mark[4].virt_text or {}) do
      texts[#texts + 1] = chunk[1]
    end
  end
  return texts
end

--- The insert texts of an InlineCompletionList or InlineCompletionItem[].
---@param result table?
---@return string[]
local function item_texts(result)
  local texts = {}
  for _, item in ipairs(result and (result.items or result) or {}) do
    local text = item.insertText
    texts[#texts + 1] = type(text) == 'table' and text.value or text
  end
  return texts
end

H.when_ready(function()
  -- Hold the answer to the next inline-completion request between the client and the plugin's handler.
  local client = assert(H.client())
  local request = client.request
  local hold, held = true, nil
  client.request = function(self, method, params, handler, bufnr)
    if method == METHOD and hold then
      hold = false
      local deliver = handler
      handler = function(...)
        held = { deliver = deliver, args = { n = select('#', ...), ... } }
      end
    end
    return request(self, method, params, handler, bufnr)
  end

  vim.api.nvim_win_set_cursor(0, { LINE, 0 })
  H.type('A ')
  H.wait_for('the answer for "alpha = "', function()
    return held ~= nil
  end, 60000, function()
    H.results.stale_answer = item_texts(held.args[2])
    H.results.line_asked = H.lines()[LINE]
    H.results.cursor_asked = vim.api.nvim_win_get_cursor(0)
    -- Rewrite the line as typed keys; the cursor ends where it was.
    H.type('<Home>omega<Del><Del><Del><Del><Del><End>')
    H.wait_for('the rewritten line', function()
      return H.lines()[LINE] == 'omega = ' and vim.api.nvim_win_get_cursor(0)[2] == #'omega = '
    end, 10000, function()
      H.results.line_changed = H.lines()[LINE]
      H.results.cursor_changed = vim.api.nvim_win_get_cursor(0)
      H.results.mode_changed = vim.api.nvim_get_mode().mode
      held.deliver(unpack(held.args, 1, held.args.n))
      H.results.ghost_after_stale = ghost.text() or vim.NIL
      H.results.drawn_after_stale = drawn()
      -- The request for the new text shows its own answer.
      H.wait_for('ghost text for "omega = "', function()
        return ghost.text() == 'answer_for_omega'
      end, 60000, function()
        H.results.ghost_new = ghost.text()
        H.results.drawn_new = drawn()
        H.finish()
      end)
    end)
  end)
end)
