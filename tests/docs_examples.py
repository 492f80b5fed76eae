#!/usr/bin/env python3
"""docs_examples.py - runs the examples of the documentation that show what
weft prints, and compares them with what it prints now.

    python3 tests/docs_examples.py WEFT DOC.md...

Two forms of example are recognised, and both read as ordinary examples:

1. A command with its result in a comment, in a ```sh block:

       ./weft check examples/mlp.plan   # ok, 4 operators, 8,388,608 parameters

   Every line of a ```sh block that runs weft (its first word is `weft` or
   `./weft`, or it is `mpirun ... weft ...`) is run and must succeed. The
   trailing comment is split at a comma or semicolon followed by a space;
   each phrase that contains a digit must occur in what the command prints
   (standard output and error together, runs of spaces counting as one),
   and phrases without a digit are description. Other lines (`make demo`)
   are instructions for the reader and are not run. A line ending in `\`
   goes on on the next line.

2. A transcript, in a block without a language:

       $ weft check examples/gpt2.plan
       examples/gpt2.plan: ok
         model gpt2: 125 operators, 124,439,808 parameters
       ...
       $ echo $?
       0

   A line starting with `$ ` is a command (`\` at its end continues it on
   the next line); the lines up to the next command are what it prints,
   standard output and error together. They must be its lines, in order
   and all of them, except that a line holding only `...` stands for any
   number of lines left out. `$ echo $?` followed by a number checks the
   exit status of the command before it. `$ cat FILE` of a FILE that does
   not exist writes the lines shown into FILE, so that a transcript can show
   the file its next commands read. Trailing spaces are not compared.

   In the output of `weft run`, what depends on the machine is not compared
   exactly: the figures of wall-clock time (a number before ` s`, ` ms`,
   ` tokens/s` or ` samples/s`) and the differences `--check` measures (a
   number after `within`, and the worst tensor's) not at all, and losses
   and gradient norms (a number after `loss ` or `norm `) to 1e-5
   relative, the tolerance of `--check`: another CPU's BLAS kernels round
   differently.

A command of either form whose comment contains `(not run: REASON)` is not
run; the reason is printed. Keep it for a command that needs what a test
machine may lack (a GPU, PyTorch), and say what.

Commands run with bash, in a scratch directory per document holding `weft`
(the binary under test, also first on PATH) and copies of the checkout's
`examples/`, `tests/`, `stdlib/` and `docs/`, and a copy of
tests/golden/check/shape_mismatch.plan, which docs/cli.md names without
its folder. The commands of one document run in order in the same directory, so a
later one may read what an earlier one wrote. The environment has no WEFT_
variables, NO_COLOR set, and OMPI_ALLOW_RUN_AS_ROOT=1 with
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 so that Open MPI's mpirun starts as root,
as README.md says to set.

Blocks of another language (```weft, ```c, ...) and blocks with no `$ `
line are not run here: tests/docs_check.sh checks the ```weft blocks, and
output shown without its command (reformatted JSON, an excerpt after
"prints for it:") is not compared, so prefer a transcript.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = ["tests/golden/check/shape_mismatch.plan"]
LINKS = ["examples", "tests", "stdlib", "docs", "bench/gpu"]  # copied into the scratch folder
TIMEOUT = 300
NOT_RUN = re.compile(r"\(not run: ([^)]*)\)")
NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
MACHINE = [re.compile(NUMBER + r"(?= (?:s|ms|tokens/s|samples/s)\b)"),
           re.compile(r"(?<=within )" + NUMBER),
           re.compile(r"(?<=worst tensor )(\S+ )" + NUMBER)]
LOSS = re.compile(r"(?<=\bloss |\bnorm )" + NUMBER)


class Example:
    def __init__(self, doc, line, kind, command, comment="", expected=None):
        self.doc, self.line, self.kind = doc, line, kind
        self.command, self.comment, self.expected = command, comment, expected
        self.status_check = None  # the status a following `$ echo $?` shows

    def where(self):
        return "%s:%d" % (self.doc, self.line)


def split_comment(text):
    """A shell line without its trailing comment, and the comment: a `#` at
    the start or after a space, outside quotes."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip(), text[i + 1:].strip()
    return text.rstrip(), ""


def runs_weft(command):
    words = command.split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if not words:
        return False
    if words[0] in ("weft", "./weft"):
        return True
    return words[0] == "mpirun" and any(w in ("weft", "./weft") for w in words)


def blocks(path):
    """(info, first line number, lines) of each fenced block."""
    out, info, start, body = [], None, 0, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            m = re.match(r"^```(\S*)\s*$", line)
            if info is None and m:
                info, start, body = m.group(1), n + 1, []
            elif info is not None and re.match(r"^```\s*$", line):
                out.append((info, start, body))
                info = None
            elif info is not None:
                body.append(line)
    if info is not None:
        sys.exit("docs-examples: %s:%d: a block that is not closed" % (path, start - 1))
    return out


def join_continued(lines, i):
    """The logical line beginning at lines[i] (joined at trailing `\\`), and
    the index after it."""
    text = lines[i]
    i += 1
    while text.endswith("\\") and i < len(lines):
        text = text[:-1].rstrip() + " " + lines[i].strip()
        i += 1
    return text, i


def examples_of(doc):
    found = []
    for info, start, body in blocks(os.path.join(ROOT, doc)):
        if info == "sh":
            i = 0
            while i < len(body):
                n = start + i
                text, i = join_continued(body, i)
                command, comment = split_comment(text)
                if runs_weft(command):
                    found.append(Example(doc, n, "sh", command, comment))
        elif info == "":
            if not any(l.startswith("$ ") for l in body):
                continue
            i, last = 0, None
            while i < len(body):
                if not body[i].startswith("$ "):
                    i += 1  # text before the first command
                    continue
                n = start + i
                text, i = join_continued(body, i)
                command, comment = split_comment(text[2:])
                expected = []
                while i < len(body) and not body[i].startswith("$ "):
                    expected.append(body[i])
                    i += 1
                if command == "echo $?":
                    if last is None or len(expected) != 1 or not expected[0].strip().isdigit():
                        found.append(Example(doc, n, "bad", command, "`$ echo $?` must follow a command and show one number"))
                    else:
                        last.status_check = int(expected[0])
                    continue
                last = Example(doc, n, "transcript", command, comment, expected)
                found.append(last)
    return found


def scratch_dir(weft):
    d = tempfile.mkdtemp(prefix="weft-docs.")
    os.symlink(os.path.abspath(weft), os.path.join(d, "weft"))
    # copies, not links: a plan that weft search writes here imports
    # examples/..., and a `use` reads nothing a link takes out of the tree
    for name in LINKS:
        shutil.copytree(os.path.join(ROOT, name), os.path.join(d, name), symlinks=True)
    for f in FIXTURES:
        shutil.copy(os.path.join(ROOT, f), d)
    return d


def environment(d):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    env["PATH"] = d + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["NO_COLOR"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    return env


def run(command, d, env, status_file):
    """Runs a pipeline with bash; its output, the exit status of each of its
    commands, and whether it ran out of time."""
    script = '%s\necho "${PIPESTATUS[*]}" > %s\n' % (command, status_file)
    if os.path.exists(status_file):
        os.remove(status_file)
    if command.split()[0] == "mpirun":
        # Open MPI keeps what it allocates at MPI_Init until exit: under
        # AddressSanitizer, the processes of mpirun skip the leak report
        env = dict(env, ASAN_OPTIONS=":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"])))
    try:
        p = subprocess.run(["bash", "-c", script], cwd=d, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        return (e.output or b"").decode("utf-8", "replace"), [124], True
    statuses = []
    if os.path.exists(status_file):
        with open(status_file) as f:
            statuses = [int(s) for s in f.read().split()]
    return p.stdout.decode("utf-8", "replace"), statuses or [p.returncode], False


def succeeded(statuses):
    # A command that feeds `head` may die of SIGPIPE (141) when head is done.
    return all(s == 0 or (s == 141 and i < len(statuses) - 1) for i, s in enumerate(statuses))


def squash(s):
    return re.sub(r"\s+", " ", s).strip()


def run_line(line):
    """A line of `weft run`'s output without what depends on the machine,
    and its losses."""
    for i, pattern in enumerate(MACHINE):
        line = pattern.sub(r"\1N" if i == 2 else "N", line)
    losses = [float(x) for x in LOSS.findall(line)]
    return LOSS.sub("L", line), losses


def same_line(want, got, of_run):
    if not of_run:
        return want == got
    (w, wl), (g, gl) = run_line(want), run_line(got)
    return w == g and all(abs(a - b) <= 1e-5 * max(abs(a), abs(b)) for a, b in zip(wl, gl))


def lines_match(expected, actual, of_run):
    """Whether the expected lines, with `...` for any lines, are the actual
    ones; and how many expected lines could be placed."""
    memo = {}
    furthest = [0]

    def go(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        furthest[0] = max(furthest[0], i)
        if i == len(expected):
            ok = j == len(actual)
        elif expected[i] == "...":
            ok = any(go(i + 1, k) for k in range(j, len(actual) + 1))
        else:
            ok = j < len(actual) and same_line(expected[i], actual[j], of_run) and go(i + 1, j + 1)
        memo[(i, j)] = ok
        return ok

    sys.setrecursionlimit(max(10000, 4 * (len(expected) + len(actual))))
    return go(0, 0), furthest[0]


def normalise(lines):
    return ["..." if l.strip() == "..." else l.rstrip() for l in lines]


def shown(out, most=60):
    """What a command printed, cut for a failure message."""
    lines = [l if len(l) <= 300 else l[:300] + " [...]" for l in out.split("\n")]
    if len(lines) > most:
        lines = lines[:most] + ["[... %d more lines]" % (len(lines) - most)]
    return "\n".join(lines)


def check(ex, d, env):
    """None when the example holds, else what is wrong."""
    if ex.kind == "bad":
        return ex.comment
    if ex.kind == "transcript":
        m = re.match(r"^cat (\S+)$", ex.command)
        if m and not os.path.exists(os.path.join(d, m.group(1))):
            with open(os.path.join(d, m.group(1)), "w") as f:
                f.write("".join(l + "\n" for l in ex.expected))
            return None
    out, statuses, timed_out = run(ex.command, d, env, d + ".status")
    if timed_out:
        return "did not finish in %d s" % TIMEOUT
    if ex.kind == "sh":
        if not succeeded(statuses):
            return "exit status %s, wanted success; it printed:\n%s" % (" | ".join(map(str, statuses)), shown(out))
        flat = squash(out)
        missing = [p for p in re.split(r"[,;]\s+", ex.comment) if re.search(r"\d", p) and squash(p) not in flat]
        if missing:
            return "the comment says %s, not in what it printed:\n%s" % (
                ", ".join("'%s'" % p for p in missing), shown(out))
        return None
    of_run = re.search(r"(^|\s|/)weft run\b", ex.command) is not None
    want = normalise(ex.expected)
    got = normalise(out.split("\n")[:-1] if out.endswith("\n") else out.split("\n")) if out else []
    ok, at = lines_match(want, got, of_run)
    problems = []
    if not ok:
        problems.append("the output differs; from the doc's line %d on (`%s`), it is:\n%s" % (
            ex.line + 1 + min(at, len(want)), want[at] if at < len(want) else "<end>", shown(out)))
    if ex.status_check is not None and statuses[-1] != ex.status_check:
        problems.append("exit status %d, the doc says %d" % (statuses[-1], ex.status_check))
    return "\n".join(problems) or None


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: docs_examples.py WEFT DOC.md...")
    weft, docs = sys.argv[1], sys.argv[2:]
    passed = failed = skipped = 0
    for doc in docs:
        d = scratch_dir(weft)
        env = environment(d)
        try:
            for ex in examples_of(doc):
                m = NOT_RUN.search(ex.comment)
                if m:
                    skipped += 1
                    print("docs-examples: %s: not run (%s): %s" % (ex.where(), m.group(1), ex.command))
                    continue
                problem = check(ex, d, env)
                if problem is None:
                    passed += 1
                else:
                    failed += 1
                    print("FAIL: %s: %s\n  %s" % (ex.where(), ex.command, problem.rstrip().replace("\n", "\n  ")))
        finally:
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(d + ".status"):
                os.remove(d + ".status")
    print("docs-examples: %d passed, %d failed, %d not run" % (passed, failed, skipped))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
