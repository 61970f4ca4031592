--- Small helpers shared by the plugin's modules: finding the client, converting LSP positions.

local M = {}

M.NAME = 'diffill'

-- Neovim 0.11 made the client's functions methods (`client:request(...)`); 0.10 has `client.request(...)`.
local methods = vim.fn.has('nvim-0.11') == 1

--- Whether `client` supports an LSP method for `bufnr`.
---@param client vim.lsp.Client
---@param method string
---@param bufnr integer
---@return boolean
function M.supports(client, method, bufnr)
  if methods then
    return client:supports_method(method, bufnr)
  end
  ---@diagnostic disable-next-line: param-type-mismatch
  return client.supports_method(method, { bufnr = bufnr })
end

--- Send a request; returns whether it was sent and its id.
---@param client vim.lsp.Client
---@param method string
---@param params table?
---@param handler lsp.Handler
---@param bufnr integer
---@return boolean, integer?
function M.request(client, method, params, handler, bufnr)
  if methods then
    return client:request(method, params, handler, bufnr)
  end
  ---@diagnostic disable-next-line: param-type-mismatch
  return client.request(method, params, handler, bufnr)
end

--- Cancel a pending request.
---@param client vim.lsp.Client
---@param id integer
function M.cancel(client, id)
  if methods then
    client:cancel_request(id)
  else
    ---@diagnostic disable-next-line: param-type-mismatch
    client.cancel_request(id)
  end
end

--- A synchronous request (for :checkhealth); the response or nil.
---@param client vim.lsp.Client
---@param method string
---@param params table?
---@param timeout_ms integer
---@param bufnr integer
---@return {err: lsp.ResponseError?, result: any}?
function M.request_sync(client, method, params, timeout_ms, bufnr)
  if methods then
    return client:request_sync(method, params, timeout_ms, bufnr)
  end
  ---@diagnostic disable-next-line: param-type-mismatch
  return client.request_sync(method, params, timeout_ms, bufnr)
end

--- Stop a client.
---@param client vim.lsp.Client
function M.stop(client)
  if methods then
    client:stop()
  else
    ---@diagnostic disable-next-line: missing-parameter
    client.stop()
  end
end

--- The diffill client attached to `bufnr` that supports `method`, if any.
---@param bufnr integer
---@param method string?
---@return vim.lsp.Client?
function M.client(bufnr, method)
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = bufnr, name = M.NAME })) do
    if method == nil or M.supports(client, method, bufnr) then
      return client
    end
  end
  return nil
end

--- The byte column of an LSP position's character offset on a buffer line.
---@param bufnr integer
---@param row integer 0-based
---@param character integer in the client's position encoding
---@param encoding string 'utf-8', 'utf-16' or 'utf-32'
---@return integer
function M.byte_col(bufnr, row, character, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if methods then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else -- 0.10: vim.str_byteindex(s, index, use_utf16) knows no UTF-32
    ---@diagnostic disable-next-line: undefined-field
    ok, col = pcall(vim.lsp.util._str_byteindex_enc, line, character, encoding)
  end
  return ok and math.min(col, #line) or #line
end

--- An LSP position's character offset of a byte column on a buffer line.
---@param bufnr integer
---@param row integer 0-based
---@param col integer byte column
---@param encoding string
---@return integer
function M.character(bufnr, row, col, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  col = math.min(col, #line)
  if encoding == 'utf-8' then
    return col
  end
  if methods then
    return vim.str_utfindex(line, encoding, col, false)
  end
  ---@diagnostic disable-next-line: undefined-field
  return vim.lsp.util._str_utfindex_enc(line, col, encoding)
end

return M
