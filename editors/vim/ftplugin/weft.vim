" Vim filetype plugin for weft parallelization plans (.plan files).

if exists('b:did_ftplugin')
  finish
endif
let b:did_ftplugin = 1

let s:cpo_save = &cpo
set cpo&vim

setlocal commentstring=#\ %s
setlocal comments=:#
setlocal shiftwidth=2 softtabstop=2 expandtab
setlocal formatoptions-=t formatoptions+=croql
setlocal suffixesadd=.plan

let b:undo_ftplugin = 'setlocal commentstring< comments< shiftwidth< softtabstop< expandtab< formatoptions< suffixesadd<'

let &cpo = s:cpo_save
unlet s:cpo_save
