-- :DiffillRewrite on a linewise visual selection of two docstring lines changes those lines (and only them).
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')

H.when_ready(function()
  H.results.before = H.lines()
  vim.api.nvim_win_set_cursor(0, { 4, 0 })
  H.type("Vj:DiffillRewrite<CR>")
  H.wait_for('the rewrite', function()
    return not vim.deep_equal(H.lines(), H.results.before)
  end, 60000, function()
    H.results.after = H.lines()
    H.results.changedtick = vim.b.changedtick
    vim.cmd('silent undo')
    H.results.after_undo = H.lines()
    H.finish()
  end)
end)
