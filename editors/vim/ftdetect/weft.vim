" Vim filetype detection for weft parallelization plans (.plan files).
autocmd BufRead,BufNewFile *.plan setfiletype weft
