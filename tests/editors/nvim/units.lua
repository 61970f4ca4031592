-- A tiny test runner for the plugin's unit scripts (run with `nvim --headless --clean -l SCRIPT`, no server):
-- `local T = dofile(.../units.lua)`, then `T.test(name, fn)` and `T.eq(actual, expected)`, and `T.finish()` last,
-- which prints "N passed, N failed" and exits non-zero on a failure.
vim.opt.runtimepath:prepend(assert(vim.env.DIFFILL_ROOT) .. '/editors/neovim')

local T = { passed = 0, failed = 0 }

--- Run one test; a raised error fails it (and is written to stderr).
---@param name string
---@param fn fun()
function T.test(name, fn)
  local ok, err = pcall(fn)
  if ok then
    T.passed = T.passed + 1
  else
    T.failed = T.failed + 1
    io.stderr:write(('FAIL %s: %s\n'):format(name, err))
  end
end

--- Fail unless the two values are deeply equal.
function T.eq(actual, expected)
  if not vim.deep_equal(actual, expected) then
    error(('expected %s, got %s'):format(vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

--- Print the counts and quit, with a failing status when a test failed.
function T.finish()
  print(('%d passed, %d failed'):format(T.passed, T.failed))
  vim.cmd(T.failed == 0 and 'qa!' or 'cq!')
end

return T
