--- `:checkhealth diffill`: Neovim's version, the server command, the model setting and the running clients.

local config = require('diffill.config')
local util = require('diffill.util')

local M = {}

local health = vim.health

local function check_neovim()
  local v = vim.version()
  local version = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.11') == 1 then
    health.ok(('Neovim %s: vim.lsp.config and vim.lsp.enable'):format(version))
  elseif vim.fn.has('nvim-0.10') == 1 then
    health.warn(('Neovim %s: works, but 0.11 or later is recommended'):format(version))
  else
    health.error(('Neovim %s is too old: diffill needs 0.10 or later'):format(version))
  end
  if vim.lsp.inline_completion then
    health.ok('ghost text: Neovim\'s own vim.lsp.inline_completion')
  else
    health.ok('ghost text: drawn by diffill with extmarks (Neovim before 0.12)')
  end
end

local function check_server(options)
  local cmd = options.cmd
  if type(cmd) ~= 'table' or cmd[1] == nil then
    health.error('`cmd` must be a list such as { "diffill", "serve" }')
    return
  end
  if vim.fn.executable(cmd[1]) ~= 1 then
    health.error(('%s is not executable'):format(cmd[1]), {
      'install diffill (pip install -e . in the repository) or set `cmd` in setup() to its full path',
    })
    return
  end
  local full = vim.list_extend(vim.deepcopy(cmd), { '--help' })
  local ok, result = pcall(function()
    return vim.system(full, { text = true }):wait(30000)
  end)
  if ok and result.code == 0 then
    health.ok(('`%s` runs'):format(table.concat(full, ' ')))
  else
    local why = ok and (result.stderr ~= '' and result.stderr or ('exit status ' .. tostring(result.code))) or result
    health.error(('`%s` failed: %s'):format(table.concat(full, ' '), vim.trim(tostring(why))))
  end
end

local function check_model(options)
  local model = options.settings.model or {}
  local path = type(model) == 'string' and model or model.path
  if path == nil or path == vim.NIL then
    health.ok('model: the embedded default model (settings.model.path not set)')
  elseif vim.fn.filereadable(vim.fs.joinpath(vim.fs.normalize(path), 'config.json')) == 1 then
    health.ok(('model: %s'):format(path))
  else
    health.error(('model: %s has no config.json'):format(path), { 'set settings.model.path to a checkpoint directory' })
  end
  if type(model) == 'table' and model.trustRemoteCode == true then
    health.warn('settings.model.trustRemoteCode is on: the checkpoint\'s own Python code runs in the server')
  end
end

local function check_clients()
  local clients = vim.lsp.get_clients({ name = util.NAME })
  if #clients == 0 then
    health.info('no diffill client is running in this session (open a file, or see :help diffill-setup)')
    return
  end
  for _, client in ipairs(clients) do
    local bufnr = next(client.attached_buffers)
    local answer = bufnr and util.request_sync(client, 'diffill/debugInfo', {}, 5000, bufnr)
    local info = answer and answer.result
    if type(info) ~= 'table' then
      health.warn(('client %d: no answer to diffill/debugInfo'):format(client.id))
    elseif info.state == 'ready' then
      health.ok(('client %d: model %s ready'):format(client.id, tostring(info.model)))
    elseif info.state == 'loading' or info.state == 'starting' then
      health.info(('client %d: the model is loading'):format(client.id))
    else
      health.error(('client %d: no model (%s): %s'):format(client.id, tostring(info.state), tostring(info.message)))
    end
  end
end

function M.check()
  local options = config.options
  health.start('diffill')
  check_neovim()
  check_server(options)
  check_model(options)
  check_clients()
end

return M
