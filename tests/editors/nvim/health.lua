-- :checkhealth diffill with the server running and its model loaded; then :DiffillRestart starts a new client.
local H = dofile(vim.env.DIFFILL_TESTS .. '/nvim/harness.lua')

H.when_ready(function()
  local source = vim.api.nvim_get_current_buf()
  local first = H.client().id
  vim.cmd('checkhealth diffill')
  H.wait_for('the health report', function()
    local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n')
    return text:find('model', 1, true) ~= nil and text:find('client', 1, true) ~= nil
  end, 30000, function()
    H.results.report = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    vim.cmd('bwipeout')
    vim.api.nvim_set_current_buf(source)
    vim.cmd('DiffillRestart')
    H.wait_for('a new client after :DiffillRestart', function()
      local client = H.client()
      return client ~= nil and client.id ~= first and client.initialized == true
    end, 60000, function()
      H.results.restarted = true
      H.finish()
    end)
  end)
end)
