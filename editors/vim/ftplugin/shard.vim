" Vim filetype plugin for shard (shardc model definitions)
if exists('b:did_ftplugin')
  finish
endif
let b:did_ftplugin = 1

setlocal commentstring=//\ %s
setlocal comments=s1:/*,mb:*,ex:*/,://
setlocal iskeyword=@,48-57,_
" `:make` checks the file; `shardc check --format short` prints one
" `file:line:col: severity[CODE]: message` line per diagnostic.
if executable('shardc')
  setlocal makeprg=shardc\ check\ --format\ short\ %
endif
setlocal errorformat=%f:%l:%c:\ %trror%m,%f:%l:%c:\ %tarning%m,%f:%l:%c:\ %tote%m,%-G%.%#

let b:undo_ftplugin = 'setlocal commentstring< comments< iskeyword< makeprg< errorformat<'
