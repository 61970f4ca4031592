-- The user's own <Tab> (tests/editors/nvim/user_tab_init.lua) still works where no ghost text is shown, and <Tab>
-- accepts ghost text where it is. Run with the server's engine built by tests/editors/rule_engine.py, on its TEXT.
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')
local ghost = require('diffill.ghost')

local LINE = 3 -- 1-based: "alpha ="

H.when_ready(function()
  H.results.mapping = vim.fn.maparg('<Tab>', 'i', false, true).desc
  -- Typed before any ghost text can arrive.
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  H.type('A<Tab><Esc>')
  H.wait_for("the user's <Tab>", function()
    return vim.api.nvim_get_mode().mode == 'n' and H.lines()[1] ~= 'import os'
  end, 10000, function()
    H.results.fallback_line = H.lines()[1]
    H.results.calls_after_fallback = vim.g.user_tab_calls
    vim.api.nvim_win_set_cursor(0, { LINE, 0 })
    H.type('A ')
    H.when_ghost_text(function()
      H.results.ghost = ghost.text()
      H.type('<Tab>')
      H.wait_for('the accepted text', function()
        return H.lines()[LINE] ~= 'alpha = '
      end, 10000, function()
        H.results.accepted_line = H.lines()[LINE]
        H.results.calls_after_accept = vim.g.user_tab_calls
        H.finish()
      end)
    end)
  end)
end)
