#!/bin/sh
# Checks the editor support under editors/ (run from the repository root by
# `make editors-check`):
#
# - VS Code: the manifests parse and agree with the grammar, and the
#   TextMate grammar passes the annotated samples in editors/vscode/test/
#   (vscode-tmgrammar-test, installed into editors/vscode/node_modules on
#   first use; skipped without npm);
# - Vim: ftdetect, ftplugin, syntax and indent files load headless without
#   errors, highlight a sample as expected and re-indent it (skipped
#   without vim);
# - Emacs: weft-mode.el byte-compiles with warnings as errors, highlights a
#   sample as expected and re-indents it (skipped without emacs).
#
# Ends with a line `editors: N passed, N failed[, N skipped]`; exits 1 if
# any check failed.

set -u

cd "$(dirname "$0")/.." || exit 2
root=$(pwd)

# The version of vscode-tmgrammar-test the grammar tests are run with.
tmgrammar_version=0.1.3

passed=0
failed=0
skipped=0
pass() { passed=$((passed + 1)); echo "editors: ok: $1"; }
fail() { failed=$((failed + 1)); echo "editors: FAIL: $1"; }
skip() { skipped=$((skipped + 1)); echo "editors: skipped $1"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-editors.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 2' INT TERM

# Runs a command with a time limit where `timeout` exists.
limited() {
  if command -v timeout >/dev/null 2>&1; then
    timeout 120 "$@"
  else
    "$@"
  fi
}

# The indentation sample: every line is where the editors must put it.
# The editors get it with the indentation removed ($tmp/flat.plan).
cat > "$tmp/sample.plan" <<'EOF'
# Indentation sample: every line is where the editors put it.
use std
param layers = 2
let sx = 3
let notq = 2 sx

op my_matmul(a: [m, k+], b: [k+, n]) -> [m, n] {
  flops = 2 * m * k * n
  kind = "matmul"   # { not a brace
}

op my_norm(x: [b.., h^], g: [h^], eps = 1e-5) -> [b.., h^] {
  flops = 8 * numel(x)
}

fn pick(flag, a, b = 2) = if flag then a else b

model tiny(batch = 8, dim = 16) {
  input x : f32[batch, dim]
  param w : f32[dim, dim]
  for i in 0..layers {
    block h.{i} {
      o = my_matmul(
        x,
        w
      )
    }
  }
  if dim > 8 {
    let z = [
      1, 2,
      3
    ]
  } else {
    let z = "\}\{ {dim}"
  }
  loss = mse(o, x)
  train sgd(lr = 0.1)
}

cluster lab(nodes = 2) {
  devices_per_node = 4
  device {
    name = "L4"
    memory = 24 GiB
    compute = { f32 = 30 TFLOP/s, bf16 = 121 TFLOP/s }
  }
  link pcie { level = "node", bandwidth = 32 GB/s, latency = 5 us }
}
EOF
sed 's/^[ 	]*//' "$tmp/sample.plan" > "$tmp/flat.plan"

# ---------------------------------------------------------------- VS Code

if command -v node >/dev/null 2>&1; then
  if node - "$root/editors/vscode" > "$tmp/manifest.out" 2>&1 <<'EOF'
const fs = require('fs');
const path = require('path');
const dir = process.argv[2];
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
const pkg = read('package.json');
const conf = read('language-configuration.json');
const grammar = read('syntaxes/weft.tmLanguage.json');
const problems = [];
const lang = (pkg.contributes.languages || []).find((l) => l.id === 'weft');
if (!lang) problems.push('package.json contributes no language "weft"');
else {
  if (!(lang.extensions || []).includes('.plan')) problems.push('language weft lacks extension .plan');
  if (!fs.existsSync(path.join(dir, lang.configuration || ''))) problems.push('language configuration file missing');
}
const g = (pkg.contributes.grammars || []).find((x) => x.language === 'weft');
if (!g) problems.push('package.json contributes no grammar for weft');
else {
  if (g.scopeName !== 'source.weft') problems.push('grammar scopeName is ' + g.scopeName);
  if (path.resolve(dir, g.path) !== path.resolve(dir, 'syntaxes/weft.tmLanguage.json')) problems.push('grammar path is ' + g.path);
}
if (grammar.scopeName !== 'source.weft') problems.push('tmLanguage scopeName is ' + grammar.scopeName);
// Every include names a rule of the repository.
const names = new Set(Object.keys(grammar.repository || {}));
const walk = (x) => {
  if (Array.isArray(x)) x.forEach(walk);
  else if (x && typeof x === 'object') {
    if (typeof x.include === 'string' && x.include.startsWith('#') && !names.has(x.include.slice(1)))
      problems.push('unknown include ' + x.include);
    Object.values(x).forEach(walk);
  }
};
walk(grammar);
// The indentation rules compile and behave.
const inc = new RegExp(conf.indentationRules.increaseIndentPattern);
const dec = new RegExp(conf.indentationRules.decreaseIndentPattern);
for (const [line, i, d] of [['model tiny(batch = 8) {', true, false], ['  o = f(x, w)', false, false],
                            ['let xs = [', true, false], ['} else {', true, true], ['let s = "{x}"', false, false],
                            ['  kind = "a{" # {', false, false], [']', false, true]]) {
  if (inc.test(line) !== i) problems.push('increaseIndentPattern on ' + JSON.stringify(line));
  if (dec.test(line) !== d) problems.push('decreaseIndentPattern on ' + JSON.stringify(line));
}
if (problems.length) { console.log(problems.join('\n')); process.exit(1); }
EOF
  then
    pass "VS Code manifests"
  else
    cat "$tmp/manifest.out"
    fail "VS Code manifests"
  fi
else
  skip "VS Code manifest check (node not found)"
fi

if command -v npm >/dev/null 2>&1; then
  tm_ok=1
  installed=$(cd editors/vscode &&
    node -p 'require("./node_modules/vscode-tmgrammar-test/package.json").version' 2>/dev/null)
  if [ "$installed" != "$tmgrammar_version" ]; then
    echo "editors: installing vscode-tmgrammar-test@$tmgrammar_version into editors/vscode/node_modules"
    if ! (cd editors/vscode &&
          npm install --no-save --no-package-lock --no-audit --no-fund \
            --loglevel=error "vscode-tmgrammar-test@$tmgrammar_version") \
          > "$tmp/npm.out" 2>&1; then
      grep -v 'Unknown user config' "$tmp/npm.out"
      fail "TextMate grammar test (npm install vscode-tmgrammar-test@$tmgrammar_version failed)"
      tm_ok=0
    fi
  fi
  if [ "$tm_ok" = 1 ]; then
    files=$(ls editors/vscode/test/*.plan 2>/dev/null | wc -l)
    assertions=$(cat editors/vscode/test/*.plan 2>/dev/null | grep -c '^#[ 	]*\(\^\|<\)')
    (cd editors/vscode &&
     limited npx --no-install vscode-tmgrammar-test \
       -g syntaxes/weft.tmLanguage.json 'test/*.plan') > "$tmp/tm.out" 2>&1
    rc=$?
    grep -v 'Unknown user config' "$tmp/tm.out"
    ok_files=$(grep -c 'run successfuly' "$tmp/tm.out")
    if [ "$rc" = 0 ] && [ "$files" -gt 0 ] && [ "$ok_files" = "$files" ]; then
      pass "TextMate grammar: $files test files, $assertions assertion lines"
    else
      fail "TextMate grammar: $((files - ok_files)) of $files test files failed"
    fi
  fi
else
  skip "TextMate grammar test (npm not found)"
fi

# -------------------------------------------------------------------- Vim

if ! command -v vim >/dev/null 2>&1; then
  skip "Vim check (vim not found)"
elif ! vim --version 2>/dev/null | grep -q '+eval' ||
     ! vim --version 2>/dev/null | grep -q '+syntax'; then
  skip "Vim check (this vim lacks +eval or +syntax)"
else
  cat > "$tmp/check.vim" <<'EOF'
let s:fail = []
if v:errmsg !=# ''
  call add(s:fail, 'error while opening a .plan file: ' . v:errmsg)
endif
if &filetype !=# 'weft'
  call add(s:fail, 'filetype is "' . &filetype . '", not weft')
endif
" Load each file again inside :try, which turns its errors into exceptions.
for s:kind in ['ftplugin', 'indent', 'syntax']
  try
    unlet! b:did_ftplugin b:did_indent b:current_syntax
    if s:kind ==# 'syntax'
      syntax clear
    endif
    execute 'source ' . fnameescape($WEFT_VIM_DIR . '/' . s:kind . '/weft.vim')
  catch
    call add(s:fail, s:kind . '/weft.vim: ' . v:exception)
  endtry
endfor
if &shiftwidth != 2 || !&expandtab || &commentstring !=# '# %s'
  call add(s:fail, printf('ftplugin: shiftwidth=%d expandtab=%d commentstring=%s', &shiftwidth, &expandtab, &commentstring))
endif
if &indentexpr !~# 'GetWeftIndent'
  call add(s:fail, 'indentexpr is ' . &indentexpr)
endif

" Syntax groups: a pattern (the match start, or \zs) and the group there.
function! s:Expect(pat, group) abort
  call cursor(1, 1)
  let l:pos = searchpos(a:pat, 'cW')
  if l:pos[0] == 0
    call add(s:fail, 'syntax: pattern not found: ' . a:pat)
    return
  endif
  let l:name = synIDattr(synID(l:pos[0], l:pos[1], 1), 'name')
  if l:name !=# a:group
    call add(s:fail, printf('syntax: %s: expected %s, got %s', a:pat, a:group, l:name))
  endif
endfunction
call s:Expect('# \zsIndentation', 'weftComment')
call s:Expect('\<use\>', 'weftInclude')
call s:Expect('\<param\>', 'weftKeyword')
call s:Expect('\<op\>', 'weftDefine')
call s:Expect('my_matmul(', 'weftFunctionName')
call s:Expect('\<fn\> \zspick', 'weftFunctionName')
call s:Expect('\<model\> \zstiny', 'weftTypeName')
call s:Expect('\<cluster\> \zslab', 'weftTypeName')
call s:Expect('k\zs+]', 'weftDimension')
call s:Expect('h\zs^', 'weftDimension')
call s:Expect('\[b\zs\.\.', 'weftDimension')
call s:Expect('0\zs\.\.layers', 'weftRange')
call s:Expect('\<f32\>', 'weftType')
call s:Expect('1e-5', 'weftFloat')
call s:Expect('0\.1', 'weftFloat')
call s:Expect('\<16\>', 'weftNumber')
call s:Expect('24 \zsGiB', 'weftUnit')
call s:Expect('30 \zsTFLOP/s', 'weftUnit')
call s:Expect('32 \zsGB/s', 'weftUnit')
call s:Expect('5 \zsus', 'weftUnit')
call s:Expect('2 \zssx', '')
call s:Expect('"\zsmatmul', 'weftString')
call s:Expect('\\}', 'weftEscape')
call s:Expect('{\zsdim}"', 'weftInterpolation')
call s:Expect('\<for\>', 'weftRepeat')
call s:Expect('\<if\>', 'weftConditional')
call s:Expect('\<train\>', 'weftKeyword')
call s:Expect('mse(', 'weftCall')
call s:Expect('numel(', 'weftBuiltin')

" Indentation: re-indent the flattened sample and compare.
normal! gg=G
let s:want = readfile($WEFT_SAMPLE)
let s:got = getline(1, '$')
for s:i in range(max([len(s:want), len(s:got)]))
  let s:w = get(s:want, s:i, '<none>')
  let s:g = get(s:got, s:i, '<none>')
  if s:w !=# s:g
    call add(s:fail, printf('indent: line %d: expected "%s", got "%s"', s:i + 1, s:w, s:g))
  endif
endfor

call writefile(s:fail, $WEFT_VIM_OUT)
if empty(s:fail)
  qall!
endif
cquit
EOF
  rm -f "$tmp/vim.out"
  WEFT_VIM_DIR="$root/editors/vim" WEFT_SAMPLE="$tmp/sample.plan" WEFT_VIM_OUT="$tmp/vim.out" \
    limited vim -es -N -u NONE -i NONE \
      --cmd "set runtimepath^=$root/editors/vim" \
      --cmd 'filetype plugin indent on' --cmd 'syntax on' \
      -S "$tmp/check.vim" "$tmp/flat.plan" < /dev/null > /dev/null 2>&1
  rc=$?
  if [ "$rc" = 0 ] && [ -f "$tmp/vim.out" ] && [ ! -s "$tmp/vim.out" ]; then
    pass "Vim: files load without errors, syntax and indentation as expected"
  else
    [ -f "$tmp/vim.out" ] && sed 's/^/  /' "$tmp/vim.out"
    fail "Vim (exit status $rc)"
  fi
fi

# ------------------------------------------------------------------ Emacs

if command -v emacs >/dev/null 2>&1; then
  mkdir "$tmp/emacs"
  cp editors/emacs/weft-mode.el "$tmp/emacs/"
  if limited emacs -Q --batch --eval '(setq byte-compile-error-on-warn t)' \
       -f batch-byte-compile "$tmp/emacs/weft-mode.el" > "$tmp/emacs.out" 2>&1; then
    pass "Emacs: weft-mode.el byte-compiles without warnings"
    cat > "$tmp/check.el" <<'EOF'
(require 'weft-mode)
(defvar weft-check-failures nil)
(defun weft-check-fail (format-string &rest args)
  "Record a failure described by FORMAT-STRING and ARGS."
  (push (apply #'format format-string args) weft-check-failures))
(let ((sample (getenv "WEFT_SAMPLE"))
      (flat (getenv "WEFT_FLAT")))
  (unless (eq (assoc-default "x.plan" auto-mode-alist #'string-match) 'weft-mode)
    (weft-check-fail "auto-mode-alist does not map .plan to weft-mode"))
  ;; Indentation.
  (with-temp-buffer
    (insert-file-contents flat)
    (weft-mode)
    (unless (equal comment-start "# ")
      (weft-check-fail "comment-start is %S" comment-start))
    (let ((inhibit-message t))
      (indent-region (point-min) (point-max)))
    (let ((got (split-string (buffer-string) "\n"))
          (want (with-temp-buffer
                  (insert-file-contents sample)
                  (split-string (buffer-string) "\n")))
          (line 1))
      (while (or got want)
        (unless (equal (car got) (car want))
          (weft-check-fail "indent: line %d: expected %S, got %S"
                           line (car want) (car got)))
        (setq got (cdr got) want (cdr want) line (1+ line)))))
  ;; Highlighting: a regexp (group 1 if any, else the match) and a face.
  (with-temp-buffer
    (insert-file-contents sample)
    (weft-mode)
    (font-lock-ensure)
    (dolist (check '(("# \\(Indentation\\)" . font-lock-comment-face)
                     ("\\_<op\\_>" . font-lock-keyword-face)
                     ("\\_<use\\_>" . font-lock-keyword-face)
                     ("\\_<for\\_>" . font-lock-keyword-face)
                     ("op \\(my_matmul\\)" . font-lock-function-name-face)
                     ("fn \\(pick\\)" . font-lock-function-name-face)
                     ("model \\(tiny\\)" . font-lock-type-face)
                     ("cluster \\(lab\\)" . font-lock-type-face)
                     ("\\_<f32\\_>" . font-lock-type-face)
                     ("24 \\(GiB\\)" . weft-unit-face)
                     ("\\_<24\\_>" . weft-number-face)
                     ("TFLOP/s" . weft-unit-face)
                     ("5 \\(us\\)" . weft-unit-face)
                     ("2 \\(sx\\)" . nil)
                     ("1e-5" . weft-number-face)
                     ("0\\.1" . weft-number-face)
                     ("k\\(\\+\\)\\]" . weft-dimension-face)
                     ("h\\(\\^\\)" . weft-dimension-face)
                     ("\\[b\\(\\.\\.\\)" . weft-dimension-face)
                     ("\"L4\"" . font-lock-string-face)
                     ("{\\(dim\\)}\"" . weft-interpolation-face)
                     ("\\(numel\\)(" . font-lock-builtin-face)))
      (goto-char (point-min))
      (cond
       ((not (re-search-forward (car check) nil t))
        (unless (null (cdr check))
          (weft-check-fail "highlight: not found: %s" (car check))))
       (t
        (let* ((pos (or (match-beginning 1) (match-beginning 0)))
               (face (get-text-property pos 'face))
               (faces (if (listp face) face (list face))))
          (unless (if (cdr check) (memq (cdr check) faces) (null face))
            (weft-check-fail "highlight: %s: expected %s, got %S"
                             (car check) (cdr check) face))))))))
(dolist (failure (reverse weft-check-failures))
  (princ (concat "  " failure "\n")))
(kill-emacs (if weft-check-failures 1 0))
EOF
    if WEFT_SAMPLE="$tmp/sample.plan" WEFT_FLAT="$tmp/flat.plan" \
         limited emacs -Q --batch -L "$tmp/emacs" -l "$tmp/check.el" \
         > "$tmp/emacs-check.out" 2>&1; then
      pass "Emacs: highlighting and indentation as expected"
    else
      cat "$tmp/emacs-check.out"
      fail "Emacs: highlighting or indentation"
    fi
  else
    cat "$tmp/emacs.out"
    fail "Emacs: weft-mode.el does not byte-compile cleanly"
  fi
else
  skip "Emacs check (emacs not found)"
fi

# ---------------------------------------------------------------- summary

if [ "$skipped" -gt 0 ]; then
  echo "editors: $passed passed, $failed failed, $skipped skipped"
else
  echo "editors: $passed passed, $failed failed"
fi
[ "$failed" = 0 ]
