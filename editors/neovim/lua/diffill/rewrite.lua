--- `:DiffillRewrite [instruction]` and `:DiffillRefine`: the server re-denoises a range of the buffer.
---
--- The server computes the edit for the buffer version it saw and applies it with `workspace/applyEdit` (one
--- change, one undo step); an edit computed for an older version is never applied.

local util = require('diffill.util')

local M = {}

local EXECUTE = 'workspace/executeCommand'

---@class diffill.RangeArgs
---@field line1 integer first line (1-based)
---@field line2 integer last line (1-based)
---@field bufnr integer?

--- The LSP range of lines `line1`..`line2`, or of the last visual selection when it was charwise on those lines.
---@param bufnr integer
---@param args diffill.RangeArgs
---@param encoding string
---@return lsp.Range
function M.range(bufnr, args, encoding)
  local first, last = vim.api.nvim_buf_get_mark(bufnr, '<'), vim.api.nvim_buf_get_mark(bufnr, '>')
  if vim.fn.visualmode() == 'v' and first[1] == args.line1 and last[1] == args.line2 then
    local last_line = vim.api.nvim_buf_get_lines(bufnr, last[1] - 1, last[1], false)[1] or ''
    local after = #last_line -- past the last selected character
    if last[2] < #last_line then
      after = last[2] + vim.str_utf_end(last_line, last[2] + 1) + 1
    end
    return {
      start = { line = first[1] - 1, character = util.character(bufnr, first[1] - 1, first[2], encoding) },
      ['end'] = { line = last[1] - 1, character = util.character(bufnr, last[1] - 1, after, encoding) },
    }
  end
  local count = vim.api.nvim_buf_line_count(bufnr)
  if args.line2 < count then
    return { start = { line = args.line1 - 1, character = 0 }, ['end'] = { line = args.line2, character = 0 } }
  end
  local last_line = vim.api.nvim_buf_get_lines(bufnr, count - 1, count, false)[1] or ''
  return {
    start = { line = args.line1 - 1, character = 0 },
    ['end'] = { line = count - 1, character = util.character(bufnr, count - 1, #last_line, encoding) },
  }
end

--- Run one of the server's range commands (`diffill.rewrite`, `diffill.refine`) on a range of the buffer.
---@param command string
---@param args diffill.RangeArgs
---@param instruction string?
function M.run(command, args, instruction)
  local bufnr = args.bufnr or vim.api.nvim_get_current_buf()
  local client = util.client(bufnr, EXECUTE)
  if client == nil then
    vim.notify('diffill: no diffill server is attached to this buffer (see :checkhealth diffill)', vim.log.levels.WARN)
    return
  end
  local arguments = { vim.uri_from_bufnr(bufnr), M.range(bufnr, args, client.offset_encoding) }
  if instruction and vim.trim(instruction) ~= '' then
    arguments[3] = vim.trim(instruction)
  end
  util.request(client, EXECUTE, { command = command, arguments = arguments }, function(err)
    if err then
      vim.notify(('diffill: %s failed: %s'):format(command, err.message), vim.log.levels.ERROR)
    end
  end, bufnr)
end

--- `:DiffillRewrite [instruction]` on the selected lines.
---@param args diffill.RangeArgs
---@param instruction string?
function M.rewrite(args, instruction)
  M.run('diffill.rewrite', args, instruction)
end

--- `:DiffillRefine` on the selected lines.
---@param args diffill.RangeArgs
function M.refine(args)
  M.run('diffill.refine', args)
end

return M
