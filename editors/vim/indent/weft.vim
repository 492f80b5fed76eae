" Vim indent file for weft parallelization plans (.plan files).
" A line is indented one 'shiftwidth' deeper than the line that holds the
" innermost bracket ({, [ or () still open before it; a line that starts
" with the closing bracket lines up with the line of its opener.

if exists('b:did_indent')
  finish
endif
let b:did_indent = 1

setlocal indentexpr=GetWeftIndent(v:lnum)
setlocal indentkeys=0},0],0),!^F,o,O,e
setlocal autoindent nolisp nosmartindent nocindent

let b:undo_indent = 'setlocal indentexpr< indentkeys< autoindent< lisp< smartindent< cindent<'

if exists('*GetWeftIndent')
  finish
endif

let s:cpo_save = &cpo
set cpo&vim

" True when the character under the cursor is inside a string or a comment.
" With weft syntax highlighting on, ask it; otherwise look at the text before
" the cursor: what is left after removing complete strings holds a '#' (a
" comment) or a '"' (an open string).
function! s:InStringOrComment() abort
  if get(b:, 'current_syntax', '') ==# 'weft'
    return synIDattr(synID(line('.'), col('.'), 0), 'name') =~# 'weft\%(String\|Comment\|Escape\|Quote\|Todo\)'
  endif
  let l:before = strpart(getline('.'), 0, col('.') - 1)
  let l:before = substitute(l:before, '"\%(\\.\|[^"\\]\)*"', '', 'g')
  return l:before =~# '[#"]'
endfunction

function! GetWeftIndent(lnum) abort
  if a:lnum <= 1
    return 0
  endif
  let l:line = getline(a:lnum)

  let l:save = winsaveview()
  call cursor(a:lnum, 1)
  let [l:olnum, l:ocol] = searchpairpos('[[({]', '', '[])}]', 'bnW', 's:InStringOrComment()', 0, 200)
  call winrestview(l:save)

  if l:olnum <= 0
    return 0
  endif
  let l:ind = indent(l:olnum)
  if l:line =~# '^\s*[])}]'
    return l:ind
  endif
  return l:ind + shiftwidth()
endfunction

let &cpo = s:cpo_save
unlet s:cpo_save
