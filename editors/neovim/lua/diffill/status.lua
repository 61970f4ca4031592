--- The server's `diffill/status` notification: kept for statuslines and announced as `User DiffillStatus`.

---@class diffill.Status
---@field method string the request, e.g. textDocument/inlineCompletion
---@field outcome string ok, empty, cache, through, not_ready, superseded, cancelled, changed, disabled, invalid, error, unreachable
---@field items integer
---@field cache_hit boolean
---@field ms number
---@field model_ms number
---@field forward_passes integer
---@field tokens_per_forward number
---@field model string
---@field state string starting, loading, ready, failed, absent, unreachable (the statusline shows `diffill <state>`)

local M = {}

---@type diffill.Status?
M.last = nil

--- The handler of `diffill/status` (registered in the client's `handlers`).
---@param _ lsp.ResponseError?
---@param result diffill.Status
function M.handler(_, result)
  M.last = result
  vim.api.nvim_exec_autocmds('User', { pattern = 'DiffillStatus', modeline = false, data = result })
end

--- A short text for a statusline: `diffill:model 41ms 2.3t/f` (`cached` for a cache hit), or '' before the first
--- request.
---@return string
function M.statusline()
  local s = M.last
  if s == nil then
    return ''
  end
  if s.state ~= 'ready' then
    return ('diffill %s'):format(s.state)
  end
  local text = ('%s %dms'):format(s.model, math.floor((s.ms or 0) + 0.5))
  if s.cache_hit then
    return text .. ' cached'
  elseif (s.forward_passes or 0) > 0 then
    return ('%s %.1ft/f'):format(text, s.tokens_per_forward or 0)
  end
  return text
end

return M
