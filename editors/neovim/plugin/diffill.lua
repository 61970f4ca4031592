-- diffill.nvim: user commands only (configuration happens in require('diffill').setup()).
if vim.g.loaded_diffill then
  return
end
vim.g.loaded_diffill = true

vim.api.nvim_create_user_command('DiffillRewrite', function(args)
  require('diffill').rewrite({ line1 = args.line1, line2 = args.line2 }, args.args)
end, { range = true, nargs = '*', desc = 'diffill: rewrite the selected lines (optional instruction)' })

vim.api.nvim_create_user_command('DiffillRefine', function(args)
  require('diffill').refine({ line1 = args.line1, line2 = args.line2 })
end, { range = true, desc = 'diffill: refine the selected lines, keeping what the model is confident in' })

vim.api.nvim_create_user_command('DiffillRestart', function()
  require('diffill').restart()
end, { desc = 'diffill: restart the language server' })

vim.api.nvim_create_user_command('DiffillStatus', function()
  local line = require('diffill').statusline()
  vim.print(line ~= '' and line or 'diffill: no request answered yet')
end, { desc = 'diffill: the last request: model, latency, tokens per forward pass' })
