--- Defaults and the merged options of diffill.nvim.
---
--- `settings` mirrors the server's settings (lsp_server/settings.py), camelCase and nested as the server reads
--- them; they are sent as `initializationOptions` and as the `diffill` section of `workspace/configuration` and
--- `workspace/didChangeConfiguration`. Settings whose default is `null` on the server (`model.path`,
--- `model.family`, `sampling.steps`) or an empty object (`sampling.overrides`) are absent here: set them to use them.

---@class diffill.GhostTextOpts
---@field enabled boolean show ghost text while typing in insert mode
---@field debounce_ms integer wait this long after the last keystroke before asking the server
---@field accept_key string|false insert-mode key that accepts the ghost text (falls through when none is shown)
---@field accept_word_key string|false insert-mode key that accepts the ghost text's next word and keeps showing the
---rest (0.10 and 0.11; falls through when none is shown; false: none)
---@field accept_line_key string|false the same for the ghost text's next line
---@field invoke_key string|false insert-mode key that asks for ghost text at once, with several candidates (LSP
---triggerKind Invoked), or shows the next of them (0.10 and 0.11; false: none)
---@field hl_group string highlight group of the ghost text

---@class diffill.Opts
---@field cmd string[] command that starts the server over stdio
---@field filetypes string[]? filetypes to attach to; nil: every filetype
---@field root_markers string[] files that mark a project root
---@field enable boolean call vim.lsp.enable('diffill') in setup()
---@field ghost_text diffill.GhostTextOpts
---@field settings table<string, any> the server's settings (see :help diffill-settings)

local M = {}

---@type diffill.Opts
M.defaults = {
  cmd = { 'diffill', 'serve' },
  filetypes = nil,
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  enable = true,
  ghost_text = {
    enabled = true,
    debounce_ms = 75,
    accept_key = '<Tab>',
    accept_word_key = false, -- e.g. '<C-Right>' (VS Code's Ctrl+Right); false: none
    accept_line_key = false, -- e.g. '<S-Tab>' (llama.vim's); false: none
    invoke_key = '<M-\\>',
    hl_group = 'DiffillGhostText',
  },
  settings = {
    model = {
      -- path = nil: the embedded model; family = nil: read from the checkpoint's config.json
      device = 'auto', -- auto (CUDA when present, else CPU), cpu, cuda, cuda:N, mps
      dtype = 'auto', -- auto, float32, bfloat16, float16
      trustRemoteCode = false, -- run a checkpoint's own modelling code (never by default)
      threads = 0, -- CPU threads for torch; 0: half the cores
      dualCache = 2, -- llada/dream: prefix/suffix keys and values refreshed every N steps; 0: off
      -- compiledLayers = nil: the server's default, 'auto' (the embedded model on the CPU runs its layers compiled
      -- for this CPU once the server has compiled them in the background; $DIFFILL_COMPILED_LAYERS=off on the
      -- machine turns that off); 'off': always eagerly
    },
    sampling = {
      -- steps = nil: the family's default number of forward passes per block
      seed = 0,
      -- overrides = { threshold = 0.8, endBias = -1 }: any other sampler setting (README, "Settings"); none by default
    },
    completion = {
      enabled = true,
      candidates = 2, -- canvases when asked for (completion items, invoked ghost text); each passing one is a suggestion
      automaticCandidates = 1, -- canvases for ghost text while typing (the plugin's requests are all automatic)
      requireContent = "asked", -- fills that must write more than whitespace: "asked", "always" or "never"
      maxTokens = 64, -- span positions at a line end or in an empty block
      lineTokens = 24, -- span positions when the cursor is mid-line
      debounceMs = 0, -- the server waits this long (after this plugin's own debounce_ms); a newer request wins
      cacheEntries = 250, -- LRU of suggestions by context; 0 turns caching off
      prefetchAccepted = true, -- fill where the cursor goes if the ghost text is accepted, in the background
      prefetchDelayMs = 150, -- ... after this long without a key (Tab starts it at once)
      typeThrough = true, -- keys typed at the cursor let a running fill finish (its suggestion's rest, if it fits)
      budgetMs = 250, -- ms of model work per fill while typing, then the best passing suggestion so far (vim.NIL: no limit)
      askedBudgetMs = 1000, -- the same for a fill asked for (completion items, invoked ghost text)
    },
    rewrite = {
      maxTokens = 256, -- span positions for a rewrite or a body fill
      candidates = 2,
      keepAbove = 0.9, -- refine: tokens the model gives at least this probability are kept
      quickFixes = true, -- offer model-made fixes for syntax diagnostics
    },
    context = {
      prefixTokens = 1024,
      suffixTokens = 256,
      otherDocuments = true,
      chunkLines = 24,
      maxChunks = 3,
    },
    diagnostics = {
      enabled = true,
      debounceMs = 300,
    },
    engine = {
      mode = 'auto', -- auto (the shared engine, else in this server), shared, inprocess, remote (url, key/keyFile)
    },
    languages = {}, -- languageIds the server acts on; empty: every language
  },
}

---@type diffill.Opts
M.options = vim.deepcopy(M.defaults)

--- Merge `opts` over the defaults (lists such as `cmd` are replaced, not merged).
---@param opts diffill.Opts|table|nil
---@return diffill.Opts
function M.merge(opts)
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  return M.options
end

return M
