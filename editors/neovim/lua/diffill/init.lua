--- diffill.nvim: ghost text, completion, select-and-rewrite and quick fixes from the diffill language server.
---
--- ```lua
--- require('diffill').setup({ settings = { model = { path = '~/models/diffill' } } })
--- ```

local config = require('diffill.config')
local ghost = require('diffill.ghost')
local status = require('diffill.status')
local util = require('diffill.util')

local M = {}

--- The client configuration for `vim.lsp.config` (also what `lsp/diffill.lua` returns).
---@param options diffill.Opts?
---@return vim.lsp.Config
function M.lsp_config(options)
  options = options or config.options
  return {
    cmd = options.cmd,
    filetypes = options.filetypes,
    root_markers = options.root_markers,
    init_options = options.settings,
    settings = { [util.NAME] = options.settings },
    handlers = { ['diffill/status'] = status.handler },
  }
end

--- Turn on ghost text in a buffer the diffill client attached to.
---@param bufnr integer
---@param client vim.lsp.Client
local function on_attach(bufnr, client)
  if not config.options.ghost_text.enabled or not util.supports(client, 'textDocument/inlineCompletion', bufnr) then
    return
  end
  if vim.lsp.inline_completion then
    ghost.attach_native(bufnr, client)
  else
    ghost.attach(bufnr)
  end
end

--- Configure diffill: `opts` is merged over the defaults (see `:help diffill-setup`).
---@param opts diffill.Opts|table|nil
function M.setup(opts)
  local options = config.merge(opts)
  ghost.setup(options.ghost_text)
  local group = vim.api.nvim_create_augroup('diffill', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == util.NAME then
        on_attach(args.buf, client)
      end
    end,
  })
  if vim.lsp.config then
    vim.lsp.config(util.NAME, M.lsp_config(options))
    if options.enable then
      vim.lsp.enable(util.NAME)
    end
  elseif options.enable then
    -- Neovim 0.10: no vim.lsp.config; start the client for each buffer of a matching filetype.
    vim.api.nvim_create_autocmd('FileType', {
      group = group,
      callback = function(args)
        if vim.bo[args.buf].buftype ~= '' then
          return
        end
        if options.filetypes and not vim.tbl_contains(options.filetypes, vim.bo[args.buf].filetype) then
          return
        end
        local lsp = M.lsp_config(options)
        vim.lsp.start({
          name = util.NAME,
          cmd = lsp.cmd,
          root_dir = vim.fs.root(args.buf, options.root_markers),
          init_options = lsp.init_options,
          settings = lsp.settings,
          handlers = lsp.handlers,
        }, { bufnr = args.buf })
      end,
    })
  end
end

--- Stop the diffill clients and start them again for the open buffers.
function M.restart()
  local clients = vim.lsp.get_clients({ name = util.NAME })
  for _, client in ipairs(clients) do
    util.stop(client)
  end
  local function start_again()
    if #vim.lsp.get_clients({ name = util.NAME }) > 0 then
      vim.defer_fn(start_again, 100)
      return
    end
    if vim.lsp.config then
      vim.lsp.enable(util.NAME) -- starts the client again for every open buffer it applies to
    else
      vim.cmd.doautoall('diffill FileType')
    end
  end
  vim.defer_fn(start_again, 100)
end

M.rewrite = require('diffill.rewrite').rewrite
M.refine = require('diffill.rewrite').refine
M.statusline = status.statusline
M.accept = ghost.accept
M.accept_word = ghost.accept_word
M.accept_line = ghost.accept_line
M.dismiss = ghost.dismiss

return M
