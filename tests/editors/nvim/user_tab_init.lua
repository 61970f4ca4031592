-- A user's config with an insert-mode <Tab> mapping of its own, made before diffill's setup(); then the minimal init.
vim.g.user_tab_calls = 0
vim.keymap.set('i', '<Tab>', function()
  vim.g.user_tab_calls = vim.g.user_tab_calls + 1
  return '<Space>[tab]'
end, { expr = true, desc = "the user's own <Tab>" })
dofile(vim.env.DIFFILL_TESTS .. '/nvim/minimal_init.lua')
