;;; weft-mode.el --- Major mode for weft parallelization plans -*- lexical-binding: t; -*-

;; Version: 0.1.0
;; Package-Requires: ((emacs "25.1"))
;; Keywords: languages

;;; Commentary:

;; A major mode for weft, a declarative language for parallelization
;; plans of deep-learning training (`.plan' files).  It provides:
;;
;; - a syntax table: `#' comments to the end of the line, "strings"
;;   with backslash escapes;
;; - font-lock for keywords, dtypes, numbers, quantities and their units
;;   (`80 GiB', `900 GB/s'), definition names (`op', `fn', `model',
;;   `cluster', `plan'), built-in functions, `{expr}' interpolation in
;;   strings and the dimension annotations of operator signatures
;;   (`[m, k+]', `[b.., h^]');
;; - indentation by bracket depth, `weft-indent-offset' columns a level;
;; - `imenu' entries for the definitions.
;;
;; Installation:
;;
;;   (add-to-list 'load-path "/path/to/weft/editors/emacs")
;;   (require 'weft-mode)
;;
;; Files whose names end in `.plan' then open in `weft-mode'.

;;; Code:

(defgroup weft nil
  "Editing weft parallelization plans."
  :group 'languages
  :prefix "weft-")

(defcustom weft-indent-offset 2
  "Number of columns for each level of indentation in `weft-mode'."
  :type 'integer
  :safe #'integerp
  :group 'weft)

(defface weft-unit-face
  '((t :inherit font-lock-builtin-face))
  "Face for the unit of a quantity, as in `80 GiB'."
  :group 'weft)

(defface weft-number-face
  '((t :inherit font-lock-constant-face))
  "Face for integer and float literals."
  :group 'weft)

(defface weft-dimension-face
  '((t :inherit font-lock-preprocessor-face))
  "Face for dimension annotations (`+', `^', `..') in operator signatures."
  :group 'weft)

(defface weft-interpolation-face
  '((t :inherit font-lock-variable-name-face))
  "Face for `{expr}' interpolation inside strings."
  :group 'weft)

(defconst weft-keywords
  '("use" "param" "let" "fn" "op" "model" "cluster" "device" "link"
    "input" "output" "block" "for" "in" "if" "then" "else" "train"
    "assert" "and" "or" "not" "plan"
    ;; Statements of plans.
    "mesh" "split" "replicate" "assign" "stage" "order" "schedule"
    "recompute" "into" "on" "as" "time" "before" "selective" "full"
    "shard" "over" "buckets" "search"
    "strategy")
  "Keywords of the weft language.")

(defconst weft-constants '("true" "false")
  "Boolean constants of the weft language.")

(defconst weft-dtypes '("f32" "bf16" "f16" "i32")
  "Element types of weft tensors.")

(defconst weft-builtins
  '("min" "max" "abs" "len" "str" "int" "float" "ceil" "floor" "sqrt"
    "log2" "range" "sum" "product" "numel" "bytes")
  "Built-in functions of the weft language.")

(defconst weft-units
  '("B" "KB" "MB" "GB" "TB" "PB" "KiB" "MiB" "GiB" "TiB" "PiB"
    "bit" "Kb" "Mb" "Gb" "Tb" "s" "ms" "us" "ns"
    "FLOP" "KFLOP" "MFLOP" "GFLOP" "TFLOP" "PFLOP")
  "Units that may follow a number in a weft quantity.")

(defconst weft--identifier-re "[A-Za-z_][A-Za-z0-9_]*"
  "Regexp for a weft identifier.")

(defconst weft--number-re
  (concat "\\_<[0-9][0-9_]*"
          "\\(?:\\.[0-9][0-9_]*\\)?"
          "\\(?:[eE][-+]?[0-9][0-9_]*\\)?")
  "Regexp for an integer or float literal.")

(defconst weft--quantity-re
  (concat "\\(" weft--number-re "\\)[ \t]*"
          "\\(\\(?:" (regexp-opt weft-units) "\\)\\(?:/s\\)?\\)"
          "\\_>")
  "Regexp for a quantity: group 1 is the number, group 2 the unit.")

(defvar weft-mode-syntax-table
  (let ((table (make-syntax-table)))
    (modify-syntax-entry ?# "<" table)
    (modify-syntax-entry ?\n ">" table)
    (modify-syntax-entry ?\" "\"" table)
    (modify-syntax-entry ?\\ "\\" table)
    (modify-syntax-entry ?_ "_" table)
    (modify-syntax-entry ?' "." table)
    (dolist (char '(?+ ?- ?* ?/ ?% ?= ?< ?> ?! ?: ?, ?\; ?. ?^))
      (modify-syntax-entry char "." table))
    table)
  "Syntax table for `weft-mode'.")

(defun weft--match-interpolation (limit)
  "Find the next `{expr}' interpolation inside a string before LIMIT.
Set the match data to it and return non-nil, or return nil."
  (let (found)
    (while (and (not found)
                (re-search-forward "{[^{}\"\n]*}" limit t))
      (let ((start (match-beginning 0)))
        (when (and (save-excursion
                     (save-match-data (nth 3 (syntax-ppss start))))
                   ;; An escaped brace (`\{') is literal text.
                   (not (eq (char-before start) ?\\)))
          (setq found t))))
    found))

(defconst weft-font-lock-keywords
  `(;; Definition names.
    (,(concat "\\_<\\(?:fn\\|op\\)\\_>[ \t]+\\(" weft--identifier-re "\\)")
     (1 font-lock-function-name-face))
    (,(concat "\\_<\\(?:model\\|cluster\\|plan\\|strategy\\)\\_>[ \t]+\\("
              weft--identifier-re "\\)")
     (1 font-lock-type-face))
    (,(regexp-opt weft-keywords 'symbols) . font-lock-keyword-face)
    (,(regexp-opt weft-constants 'symbols) . font-lock-constant-face)
    (,(regexp-opt weft-dtypes 'symbols) . font-lock-type-face)
    (,(concat "\\(" (regexp-opt weft-builtins 'symbols) "\\)[ \t]*(")
     (1 font-lock-builtin-face))
    ;; Quantities before plain numbers, so that the unit is seen.
    (,weft--quantity-re
     (1 'weft-number-face)
     (2 'weft-unit-face))
    (,weft--number-re . 'weft-number-face)
    ;; Dimension annotations: `k+' and `b..' before `,', `]' or `)';
    ;; `^' is only ever a dimension annotation.
    ("\\(?:\\sw\\|\\s_\\)\\(\\+\\|\\.\\.\\)[ \t]*[],)]"
     (1 'weft-dimension-face))
    ("\\^" . 'weft-dimension-face)
    ;; Interpolation inside strings.
    (weft--match-interpolation (0 'weft-interpolation-face prepend)))
  "Font-lock rules for `weft-mode'.")

(defvar weft-imenu-generic-expression
  `(("Operators" ,(concat "^\\s-*op\\s-+\\(" weft--identifier-re "\\)") 1)
    ("Functions" ,(concat "^\\s-*fn\\s-+\\(" weft--identifier-re "\\)") 1)
    ("Models" ,(concat "^\\s-*model\\s-+\\(" weft--identifier-re "\\)") 1)
    ("Clusters" ,(concat "^\\s-*cluster\\s-+\\(" weft--identifier-re "\\)") 1)
    ("Plans" ,(concat "^\\s-*plan\\s-+\\(" weft--identifier-re "\\)") 1))
  "Imenu entries for the definitions of a weft file.")

(defun weft--calculate-indentation ()
  "Return the column to which the current line should be indented.
A line is indented `weft-indent-offset' columns deeper than the line
that holds the innermost bracket still open before it; a line that
starts with the closing bracket lines up with the line of its opener."
  (save-excursion
    (back-to-indentation)
    (let* ((state (syntax-ppss))
           (open (nth 1 state)))
      (cond
       ;; Inside a string that spans lines: leave the line alone.
       ((nth 3 state) (current-indentation))
       ((null open) 0)
       (t
        (let ((closing (looking-at-p "\\s)")))
          (goto-char open)
          (+ (current-indentation)
             (if closing 0 weft-indent-offset))))))))

(defun weft-indent-line ()
  "Indent the current line as weft code."
  (interactive)
  (let ((column (weft--calculate-indentation))
        (offset (- (current-column) (current-indentation))))
    (indent-line-to column)
    (when (> offset 0)
      (forward-char offset))))

;;;###autoload
(define-derived-mode weft-mode prog-mode "weft"
  "Major mode for editing weft parallelization plans (`.plan' files).

\\{weft-mode-map}"
  :syntax-table weft-mode-syntax-table
  :group 'weft
  (setq-local comment-start "# ")
  (setq-local comment-start-skip "#+[ \t]*")
  (setq-local comment-end "")
  (setq-local font-lock-defaults '(weft-font-lock-keywords))
  (setq-local indent-line-function #'weft-indent-line)
  (setq-local indent-tabs-mode nil)
  (setq-local electric-indent-chars
              (append "}])" electric-indent-chars))
  (setq-local imenu-generic-expression weft-imenu-generic-expression))

;;;###autoload
(add-to-list 'auto-mode-alist '("\\.plan\\'" . weft-mode))

(provide 'weft-mode)

;;; weft-mode.el ends here
