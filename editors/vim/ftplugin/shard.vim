" Vim filetype plugin for shard (shardc model definitions)
if exists('b:did_ftplugin')
  finish
endif
let b:did_ftplugin = 1

setlocal commentstring=//\ %s
setlocal comments=s1:/*,mb:*,ex:*/,://
setlocal iskeyword=@,48-57,_
if executable('shardc')
  setlocal makeprg=shardc\ check\ %
endif

let b:undo_ftplugin = 'setlocal commentstring< comments< iskeyword< makeprg<'
