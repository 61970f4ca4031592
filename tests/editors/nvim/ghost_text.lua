-- Ghost text: type in insert mode inside a docstring (any text parses there, so even a random model's fill
-- passes the syntax check), see the ghost text drawn, accept it with <Tab>; <Tab> with no ghost text is a tab.
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')
local ghost = require('diffill.ghost')

local LINE = 4 -- 1-based: "    The greeting is printed."

H.when_ready(function()
  H.results.omnifunc = vim.bo.omnifunc
  -- <Tab> typed before any ghost text could arrive falls through to what <Tab> does (the Python ftplugin's
  -- softtabstop makes it spaces).
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  H.type('A x<Tab>y<Esc>')
  H.wait_for('the fall-through <Tab>', function()
    return vim.api.nvim_get_mode().mode == 'n' and H.lines()[2]:find('x[\t ]+y') ~= nil
  end, 10000, function()
    H.results.fallthrough_line = H.lines()[2]
    vim.api.nvim_win_set_cursor(0, { LINE, 0 })
    H.type('A It')
    H.when_ghost_text(function()
      local marks = vim.api.nvim_buf_get_extmarks(0, -1, 0, -1, { details = true })
      H.results.ghost = ghost.text()
      H.results.extmarks = #marks
      H.results.before_accept = H.lines()[LINE]
      H.results.mode_before_accept = vim.api.nvim_get_mode().mode
      H.type('<Tab>')
      H.wait_for('the accepted text', function()
        return H.lines()[LINE] ~= H.results.before_accept
      end, 10000, function()
        H.results.after_accept = table.concat(vim.api.nvim_buf_get_lines(0, LINE - 1, LINE + 10, false), '\n')
        H.results.status = require('diffill').statusline()
        H.type('<Esc>')
        H.wait_for('normal mode', function()
          return vim.api.nvim_get_mode().mode == 'n'
        end, 5000, function()
          H.results.visible_after_esc = ghost.visible()
          H.finish()
        end)
      end)
    end)
  end)
end)
