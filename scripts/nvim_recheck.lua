-- Neovim's own LSP client against `shardc lsp`: a file changed on disk
-- re-checks the buffer that imports it. Run headless by tests/lsp_nvim.rs:
--
--   nvim --headless --clean -l scripts/nvim_recheck.lua SHARDC DIR
--
-- DIR holds main.shard (open in the editor, importing lib.shard) and
-- lib.shard (never opened). The script opens main.shard, waits for its
-- diagnostics (none) and for the server to register its file watchers, then
-- rewrites lib.shard on disk with a shape error and waits for main.shard's
-- diagnostics to show it (E0208 at the instantiation): Neovim's watcher
-- reports the change (workspace/didChangeWatchedFiles), which is the only
-- way the server can learn of it. On Linux Neovim offers watched files only
-- when asked (dynamicRegistration), as a user's config does. Prints one line
-- per step; exits 0 when every step held, 1 at the first that did not.

local shardc, dir = arg[1], arg[2]
if not shardc or not dir then
  io.stderr:write('usage: nvim --headless --clean -l nvim_recheck.lua SHARDC DIR\n')
  os.exit(2)
end

local function fail(msg)
  io.stdout:write('FAIL: ' .. msg .. '\n')
  os.exit(1)
end

local function say(msg)
  io.stdout:write(msg .. '\n')
end

local main = dir .. '/main.shard'
local main_uri = vim.uri_from_fname(main)
-- Every publishDiagnostics for main.shard, in order: its list of codes.
local published = {}
local registered = false

local caps = vim.lsp.protocol.make_client_capabilities()
caps.workspace.didChangeWatchedFiles.dynamicRegistration = true

vim.cmd.edit(main)
local buf = vim.api.nvim_get_current_buf()
local id = vim.lsp.start({
  name = 'shardc',
  cmd = { shardc, 'lsp' },
  root_dir = dir,
  capabilities = caps,
  handlers = {
    ['textDocument/publishDiagnostics'] = function(err, result, ctx, config)
      if result and result.uri == main_uri then
        local codes = {}
        for _, d in ipairs(result.diagnostics) do
          table.insert(codes, tostring(d.code))
        end
        table.insert(published, codes)
      end
      return vim.lsp.diagnostic.on_publish_diagnostics(err, result, ctx, config)
    end,
    ['client/registerCapability'] = function(err, result, ctx)
      for _, r in ipairs(result.registrations or {}) do
        if r.method == 'workspace/didChangeWatchedFiles' then
          registered = true
        end
      end
      return vim.lsp.handlers['client/registerCapability'](err, result, ctx)
    end,
  },
}, { bufnr = buf })
if not id then
  fail('the client did not start')
end

if not vim.wait(30000, function() return #published > 0 end, 20) then
  fail('no diagnostics for main.shard within 30 s')
end
if #published[#published] ~= 0 then
  fail('main.shard is not clean at first: ' .. table.concat(published[#published], ', '))
end
say('opened main.shard: no diagnostics')
if not vim.wait(10000, function() return registered end, 20) then
  fail('the server did not register watched files within 10 s')
end
say('the server registered watchers for **/*.shard')
-- Let the watcher settle on the directory before the change.
vim.wait(500)

local before = #published
local f = assert(io.open(dir .. '/lib.shard', 'r'))
local lib = f:read('a')
f:close()
local broken = lib:gsub('f32%[D, 4%]', 'f32[6, 4]')
f = assert(io.open(dir .. '/lib.shard', 'w'))
f:write(broken)
f:close()
say('rewrote lib.shard on disk (not open in the editor)')

local function shows(code)
  for i = before + 1, #published do
    for _, c in ipairs(published[i]) do
      if c == code then
        return true
      end
    end
  end
  return false
end
if not vim.wait(30000, function() return shows('E0208') end, 20) then
  fail('main.shard was not re-checked within 30 s of lib.shard changing on disk')
end
say('main.shard re-checked: E0208 from lib.shard, shown at the import\'s use')

vim.lsp.stop_client(id)
vim.wait(2000, function() return vim.lsp.get_client_by_id(id) == nil end, 20)
os.exit(0)
