-- Steps for scenario scripts run with `nvim --headless -u minimal_init.lua -c "luafile SCENARIO"`: each step is
-- scheduled with vim.defer_fn so that Neovim processes typed input and LSP messages in between (under `-l` or inside
-- vim.wait the input queue is not processed). The outcome goes as JSON to $DIFFILL_TEST_OUT, then Neovim quits.
local H = { results = {}, log = {} }

local function write(outcome)
  local file = assert(io.open(assert(vim.env.DIFFILL_TEST_OUT), 'w'))
  file:write(vim.json.encode(outcome))
  file:close()
end

--- Record the outcome and quit.
---@param err string?
function H.finish(err)
  write({ ok = err == nil, error = err, results = H.results, log = H.log })
  vim.cmd('qa!')
end

--- Run `fn` in a protected call; any error ends the scenario with that error.
---@param fn fun()
function H.step(fn)
  return function()
    local ok, err = xpcall(fn, debug.traceback)
    if not ok then
      H.finish(tostring(err))
    end
  end
end

--- Call `next_step` once `cond()` is true, polling every 50 ms; fail with `what` after `timeout_ms`.
---@param what string
---@param cond fun(): boolean
---@param timeout_ms integer
---@param next_step fun()
function H.wait_for(what, cond, timeout_ms, next_step)
  local deadline = vim.uv.now() + timeout_ms
  local function poll()
    local ok, done = pcall(cond)
    if ok and done then
      H.step(next_step)()
    elseif vim.uv.now() > deadline then
      H.finish(('timed out waiting for %s%s'):format(what, ok and '' or (': ' .. tostring(done))))
    else
      vim.defer_fn(poll, 50)
    end
  end
  vim.defer_fn(poll, 50)
end

--- The diffill client of the current buffer.
---@return vim.lsp.Client?
function H.client()
  return vim.lsp.get_clients({ bufnr = 0, name = 'diffill' })[1]
end

--- Call `next_step` once the diffill client is attached and its model has loaded.
---@param next_step fun()
function H.when_ready(next_step)
  local state = 'none'
  local asked = false
  H.wait_for('the model to load', function()
    local client = H.client()
    if client and not asked then
      asked = true
      client:request('diffill/debugInfo', {}, function(_, info)
        asked = false
        state = info and info.state or 'none'
      end, 0)
    end
    if state == 'failed' or state == 'absent' then
      error('the server has no model: ' .. state)
    end
    return state == 'ready'
  end, 120000, next_step)
end

--- Call `next_step` once the plugin shows ghost text (the first answer may wait for the model: up to 60 s).
---@param next_step fun()
function H.when_ghost_text(next_step)
  H.wait_for('ghost text', function()
    return require('diffill.ghost').visible()
  end, 60000, next_step)
end

--- Type keys as a user would (they go through the input queue: mappings, insert mode, autocommands).
---@param keys string
function H.type(keys)
  vim.api.nvim_input(keys)
end

--- The lines of the current buffer.
---@return string[]
function H.lines()
  return vim.api.nvim_buf_get_lines(0, 0, -1, false)
end

return H
