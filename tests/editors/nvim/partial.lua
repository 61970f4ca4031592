-- Ghost text accepted a word and a line at a time through the real server: the rest stays on screen with no new
-- request, a typed character dismisses the rest (and asks again), <Tab> takes the rest. Run with the server's engine built by
-- tests/editors/rule_engine.py, on its MEAN_TEXT, and partial_init.lua (the word key <C-Right>, the line key <S-Tab>).
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')
local ghost = require('diffill.ghost')

local LINE = 3 -- 1-based: "    result ="
local METHOD = 'textDocument/inlineCompletion'

-- Count the inline-completion requests the plugin sends.
local requests = 0
H.when_ready(function()
  local c = assert(H.client())
  local request = c.request
  c.request = function(self, method, ...)
    if method == METHOD then
      requests = requests + 1
    end
    return request(self, method, ...)
  end

  --- After `keys`, wait past the debounce and the server's answer time, then record what the user sees as `name`.
  local function step(name, keys, next_step)
    H.type(keys)
    local settle = vim.uv.now() + 400
    H.wait_for(name, function()
      return vim.uv.now() > settle
    end, 5000, function()
      H.results[name] = { lines = H.lines(), ghost = ghost.text() or vim.NIL, requests = requests,
        mode = vim.api.nvim_get_mode().mode }
      next_step()
    end)
  end

  vim.api.nvim_win_set_cursor(0, { LINE, 0 })
  H.type('A ')
  H.when_ghost_text(function()
    H.results.ghost = ghost.text()
    H.results.requests_shown = requests
    step('word', '<C-Right>', function()
      step('typed', 'x', function()
        -- back to where the suggestion was asked: it is shown again (from the server's cache)
        H.type('<BS><BS><BS><BS><BS><BS>')
        H.wait_for('ghost text again', function()
          return ghost.visible() and H.lines()[LINE] == '    result = '
        end, 60000, function()
          H.results.ghost_again = ghost.text()
          step('line', '<S-Tab>', function()
            step('rest', '<Tab>', function()
              H.finish()
            end)
          end)
        end)
      end)
    end)
  end)
end)
