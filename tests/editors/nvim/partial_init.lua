-- A user's config with the word and line keys of the ghost text set; then the minimal init.
vim.g.diffill_test_ghost_text = { accept_word_key = '<C-Right>', accept_line_key = '<S-Tab>' }
dofile(vim.env.DIFFILL_TESTS .. '/nvim/minimal_init.lua')
