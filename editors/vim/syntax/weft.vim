" Vim syntax file for weft parallelization plans (.plan files).

if exists('b:current_syntax')
  finish
endif

let s:cpo_save = &cpo
set cpo&vim

syn case match
syn iskeyword @,48-57,_

" Comments
syn keyword weftTodo contained TODO FIXME XXX NOTE
syn match weftComment "#.*$" contains=weftTodo,@Spell

" Keywords
syn keyword weftConditional if then else
syn keyword weftRepeat for in
syn keyword weftInclude use
syn keyword weftKeyword param let device input output train assert
syn keyword weftKeyword block link nextgroup=weftSectionName skipwhite
" Statements of plans.
syn keyword weftKeyword mesh split replicate assign stage order schedule
syn keyword weftKeyword recompute into on as time before selective full
syn keyword weftKeyword shard over buckets search
syn keyword weftOperatorWord and or not
syn keyword weftBoolean true false
syn keyword weftType f32 bf16 f16 i32

" Definitions: the name after the keyword.
syn keyword weftDefine fn op nextgroup=weftFunctionName skipwhite
syn keyword weftDefine model cluster plan strategy nextgroup=weftTypeName skipwhite
syn match weftFunctionName "\h\w*" contained
syn match weftTypeName "\h\w*" contained
syn match weftSectionName "\h\w*" contained

" Calls: name(
syn match weftCall "\<\h\w*\ze\s*("
syn match weftBuiltin "\<\%(min\|max\|abs\|len\|str\|int\|float\|ceil\|floor\|sqrt\|log2\|range\|sum\|product\|numel\|bytes\)\ze\s*("

" Operators
syn match weftOperator "[-+*/%=<>!]=\=\|->"
syn match weftRange "\.\."

" Dimension annotations of operator signatures: k+, h^, b..
syn match weftDimension "\%(\w\)\@<=[+^]\ze\s*[],)]"
syn match weftDimension "\^"
syn match weftDimension "\%(\w\)\@<=\.\.\ze\s*[],)]"

" Numbers: 42, 1_000, 0.5, 1e-5, 2.5e3
syn match weftNumber "\<\d[0-9_]*\>"
syn match weftFloat "\<\d[0-9_]*\.\d[0-9_]*\%([eE][+-]\=\d[0-9_]*\)\=\>"
syn match weftFloat "\<\d[0-9_]*[eE][+-]\=\d[0-9_]*\>"

" Units after a number: 80 GiB, 900 GB/s, 25 Gb/s, 312 TFLOP/s, 2 us
syn match weftUnit "\%(\<\d[0-9_]*\%(\.\d[0-9_]*\)\=\%([eE][+-]\=\d[0-9_]*\)\=\s*\)\@<=\%([KMGTP]\=FLOP\|[KMGTP]iB\|[KMGTP]\=B\|bit\|[KMGT]b\|[mun]\=s\)\%(/s\)\=\>"

" Strings with escapes and {expr} interpolation
syn region weftString matchgroup=weftQuote start=+"+ skip=+\\\\\|\\"+ end=+"+ end=+$+ contains=weftEscape,weftEscapeError,weftInterpolation,@Spell
syn match weftEscapeError +\\.+ contained
syn match weftEscape +\\[nt\\"{}]+ contained
syn cluster weftExpr contains=weftConditional,weftRepeat,weftKeyword,weftOperatorWord,weftBoolean,weftType,weftCall,weftBuiltin,weftOperator,weftRange,weftNumber,weftFloat,weftUnit,weftString,weftInterpolationBraces
syn region weftInterpolation matchgroup=weftInterpolationDelimiter start=+{+ end=+}+ contained contains=@weftExpr
syn region weftInterpolationBraces start=+{+ end=+}+ contained transparent contains=@weftExpr

syn sync minlines=200

hi def link weftTodo Todo
hi def link weftComment Comment
hi def link weftConditional Conditional
hi def link weftRepeat Repeat
hi def link weftInclude Include
hi def link weftKeyword Keyword
hi def link weftOperatorWord Operator
hi def link weftBoolean Boolean
hi def link weftType Type
hi def link weftDefine Keyword
hi def link weftFunctionName Function
hi def link weftTypeName Typedef
hi def link weftSectionName Identifier
hi def link weftCall Function
hi def link weftBuiltin Function
hi def link weftOperator Operator
hi def link weftRange Operator
hi def link weftDimension Special
hi def link weftNumber Number
hi def link weftFloat Float
hi def link weftUnit Special
hi def link weftString String
hi def link weftQuote String
hi def link weftEscape SpecialChar
hi def link weftEscapeError Error
hi def link weftInterpolationDelimiter Delimiter

let b:current_syntax = 'weft'

let &cpo = s:cpo_save
unlet s:cpo_save
