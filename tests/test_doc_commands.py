#!/usr/bin/python3
"""Every command line the docs and recipes show still parses: a doc cannot drift from the CLI.

Where the command lines come from:
  - code blocks of README.md, bench/README.md, docs/*.md and examples/**/*.md: fenced ones
    (no language, sh, bash, console, shell) and indented ones (4 spaces, outside lists);
  - comment lines of the recipes and launchers (examples/**/*.toml, examples/*/launch/*) that
    are indented at least two spaces after the `#` (`#   spotrain train --config ...`), the way
    their example commands are written; prose comments (`# spotrain rejects ...`) are not;
  - the launcher container of examples/resnet50/launch/mpijob.yaml (its command, args and env;
    needs PyYAML, else skipped with a note).
Backslash-continued lines are joined; `$ ` and `+ ` prompts, `FOO=1` assignments, `sudo`/`env`,
`mpirun ...`/`srun ...`/`timeout N` prefixes are stripped, `cmd1 && cmd2`, `;`, `|`, `&` and
mpirun's `A : B` (one command per app) are split, redirections dropped, `# comments` cut.

What is checked, by the command's first word:
  - spotrain (any path whose last part is `spotrain`, or `docker|podman run ... IMAGE ARGS`
    with an image named spotrain:TAG, whose entry point is spotrain): run with this test's
    binary and `--dry-run` appended; it must exit 0. A `...` word (arguments left out) is
    dropped; the rest must parse. Paths need not exist (--dry-run opens no data), except
    `--config FILE`, which is read: a recipe path must exist; a run folder's `config.toml`
    that does not exist (`runs/x/config.toml`) is replaced by one `train --dry-run` wrote.
  - the launcher (`spotrain-mpirun`, any `.../mpirun.sh`): run as
    examples/resnet50/launch/mpirun.sh with DRY_RUN=1, SPOTRAIN=this binary, the line's own
    variables; a HOSTFILE that is not a file of the repository is replaced by a temporary one
    with enough nodes, a HOST_DISCOVERY command by one that lists enough hosts. It must exit 0,
    and the `spotrain train` arguments of the mpirun command it prints must pass --dry-run.
  - `sbatch [OPTIONS] SCRIPT.sbatch ARGS`: the script must exist, and `spotrain train ARGS`
    (the script's default arguments when there are none) must pass --dry-run.
  - scripts of the repository (`bench/x.py`, `python3 bench/x.py`, `./scripts/x.sh`,
    `tests/x.sh`): the file must exist and each `--option` the line gives must appear in its
    source or in a bench/, scripts/ or tests/ script its source names (the one it passes them
    to). Nothing is run.
  - a usage summary (a block with `a|b` alternatives or `[optional]` parts, e.g. README's
    "spotrain train --model ...|..." table, `mpirun.sh HOSTFILE NP [spotrain train
    arguments...]`): for spotrain, the subcommand must exist and every option it names must be
    in that subcommand's --help; for a launcher or a script, the file must exist (and for
    mpirun.sh its --help must show the same usage).
  - every TOML recipe under examples/: `spotrain train --config FILE --dry-run` (bench for a
    file with a [bench] section and no [train] one); a catalog of offers (`[[offer]]` tables)
    is planned for real: `spotrain plan --catalog FILE --epochs 1 --max-hosts 1`.

One line per command (file:line, OK/FAIL/SKIP, the command, the first error line) and a count;
exit 1 on any failure, a stale ALLOW entry, or fewer than MIN_CHECKS commands run (an
extractor that finds nothing must not pass). Run from anywhere:

  tests/test_doc_commands.py SPOTRAIN_BINARY SOURCE_DIR
"""
import glob
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

if len(sys.argv) != 3:
    sys.exit("usage: test_doc_commands.py SPOTRAIN_BINARY SOURCE_DIR")
SPOTRAIN = os.path.abspath(sys.argv[1])
SRC = os.path.abspath(sys.argv[2])
LAUNCHER = os.path.join(SRC, "examples/resnet50/launch/mpirun.sh")
TIMEOUT_S = 30

# At least this many commands must be run (spotrain, launcher, sbatch lines and recipes; usage
# summaries and scripts not counted): the docs show about 50.
MIN_CHECKS = 30

# Lines not checked, each with its reason: (file, text the command contains) -> reason. Keep
# it short: fix the doc, or teach the extractor, before adding one. An entry that matches
# nothing fails the test.
ALLOW = {
}

# Whole words that stand for a value the reader fills in, and a value that parses in their place.
PLACEHOLDERS = {
    "USD": "1.00",  # --price-per-hour USD (imagenet-cpu-bf16.toml)
}

# spotrain refuses --threads / --workers far beyond the machine's cores (more than
# max(16, 4 x cores)); the docs show bigger nodes than the one the test runs on, so a count above
# 16 (which every machine takes) is checked as 16.
MACHINE_BOUND = ("--threads", "--workers")
MACHINE_SAFE = 16

# Subcommands whose --dry-run reads the inputs the line names, to say what it would do. For
# them an exit 1 whose error names one of the line's own paths (not there on this machine)
# passes: the command line itself parsed (a bad one exits 2).
READS_INPUTS = {
    ("data", "sort-val"): "data sort-val --dry-run reads DIR and LABELS to count what it would move",
}

# mpirun.sh's settings: taken from the command line only, never from this test's environment.
LAUNCHER_VARS = """RANKS_PER_NODE THREADS_PER_RANK BIND_TO MPI_IFNAME SPOTRAIN MPIRUN MPIRUN_ARGS
    EXTRA_ENV DRY_RUN HOST_DISCOVERY MIN_HOSTS HOST_WAIT_MAX DISCOVERY_INTERVAL MAX_RESTARTS
    RESTART_DELAY RESTART_DELAY_MAX OOB_KEEPALIVE SURVIVOR_WAIT""".split()

SHELL_LANGS = {"", "sh", "bash", "console", "shell", "shell-session", "zsh"}
# A usage summary: `a|b` alternatives, `[--opt ...]` / `[ARGS...]` optional parts.
SYNOPSIS_RE = re.compile(r"\[[-\w.]|\w\|\w|\|\s+-|\w\.\.\.\]")
IMAGE_RE = re.compile(r"^(?:[^\s/]+/)*spotrain:\w[\w.-]*$")
OPTION_RE = re.compile(r"(?<![\w/.-])(--?[A-Za-z][\w-]*)")
LAUNCHER_NAMES = ("spotrain-mpirun", "mpirun.sh")
PREFIX_CMDS = ("mpirun", "mpiexec", "orterun", "srun", "timeout")
NOISE = ("sudo", "env", "nohup", "exec", "time")


class Note(str):
    """A check's result that is a pass, with a remark."""


class Cmd:
    """One command line: where it is, its text, and what kind of check it gets."""

    def __init__(self, where, text, synopsis=False):
        self.where, self.text, self.synopsis = where, text, synopsis


# ---------------------------------------------------------------- extraction

def rel(path):
    return os.path.relpath(path, SRC)


def join_continued(lines):
    """[(lineno, text)] -> logical lines, backslash continuations joined."""
    out, cur, start = [], None, 0
    for no, text in lines:
        if cur is None:
            cur, start = "", no
        stripped = text.rstrip()
        if stripped.endswith("\\"):
            cur += stripped[:-1] + " "
            continue
        out.append((start, cur + stripped))
        cur = None
    if cur is not None:
        out.append((start, cur))
    return out


def markdown_blocks(path):
    """Code blocks of a markdown file: lists of (lineno, text)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks = []
    fence, fence_indent, block = None, 0, []
    in_list = False
    indented, prev_blank = [], True
    for no, line in enumerate(lines, 1):
        if fence is not None:
            if re.match(r"^\s*" + re.escape(fence) + r"\s*$", line):
                if block is not None:
                    blocks.append(block)
                fence, block = None, []
                continue
            if block is not None:
                block.append((no, line[fence_indent:] if line[:fence_indent].strip() == "" else line))
            continue
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w-]*)", line)
        if m:
            if indented:
                blocks.append(indented)
                indented = []
            fence, fence_indent = m.group(2), len(m.group(1))
            block = [] if m.group(3).lower() in SHELL_LANGS else None
            prev_blank = False
            continue
        blank = line.strip() == ""
        if re.match(r"^\s{0,3}([-*+]|\d+[.)])\s", line):
            in_list = True
        elif not blank and not line.startswith(" ") and prev_blank:
            in_list = False
        if not in_list and line.startswith("    ") and not blank and (prev_blank or indented):
            indented.append((no, line[4:]))
        elif indented and not blank:
            blocks.append(indented)
            indented = []
        prev_blank = blank
    if indented:
        blocks.append(indented)
    return blocks


def comment_lines(path):
    """Example commands in a file's comments: lines indented 2 to 4 spaces after the `#` (deeper
    ones are aligned prose) and their backslash continuations; each logical line its own block."""
    blocks = []
    run = []
    for no, line in enumerate(open(path, encoding="utf-8", errors="replace").read().split("\n"), 1):
        m = re.match(r"^\s*#(?![!])( *)(.*)$", line)
        continued = run and run[-1][1].rstrip().endswith("\\")
        if m and m.group(2).strip() and (continued or 2 <= len(m.group(1)) <= 4):
            run.append((no, m.group(2)))
            continue
        if run:
            blocks.extend([[x] for x in join_continued(run)])
            run = []
    if run:
        blocks.extend([[x] for x in join_continued(run)])
    return blocks


def split_words(text):
    """Shell words of a line: quotes removed, `;&|<>` operators as words of their own."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    return list(lex)


def simple_commands(words):
    """Words -> simple commands: split on ; && || | &, redirections dropped."""
    cmds, cur, i = [], [], 0
    while i < len(words):
        w = words[i]
        if w and set(w) <= set(";&|"):
            cmds.append(cur)
            cur = []
        elif w and w[0] in "<>" and set(w) <= set("<>&"):
            if cur and cur[-1].isdigit():
                cur.pop()  # 2>...
            i += 1  # and its target
        else:
            cur.append(w)
        i += 1
    cmds.append(cur)
    return [c for c in cmds if c]


def strip_prefix(words):
    """(env assignments, words without them and without sudo/env/nohup/exec/time)."""
    env, i = {}, 0
    while i < len(words):
        w = words[i]
        if re.match(r"^[A-Za-z_]\w*=", w):
            k, v = w.split("=", 1)
            env[k] = v
        elif w in NOISE:
            pass
        elif i > 0 and words[i - 1] in ("sudo", "env") and w.startswith("-"):
            pass
        else:
            break
        i += 1
    return env, words[i:]


def base(w):
    return w.rsplit("/", 1)[-1]  # "" for a folder (`tools/spotrain/`)


def is_script(w):
    return "/" in w and not w.startswith("/") and (re.search(r"\.(sh|py)$", w) is not None
                                                   or os.path.isfile(os.path.join(SRC, w)))


def classify(words):
    """What a simple command (env stripped) runs: a list of (kind, words) with kind one of
    spotrain, launcher, sbatch, script; [] when it is none of them."""
    if not words:
        return []
    w0 = base(words[0])
    if w0 == "spotrain":
        return [("spotrain", words)]
    if w0 in LAUNCHER_NAMES:
        return [("launcher", words)]
    if w0 == "sbatch":
        return [("sbatch", words)]
    if w0 in PREFIX_CMDS:
        parts, cur = [], []
        for w in words[1:]:
            if w == ":" and w0 in ("mpirun", "mpiexec", "orterun"):
                parts.append(cur)
                cur = []
            else:
                cur.append(w)
        parts.append(cur)
        out = []
        for p in parts:
            for i, w in enumerate(p):
                if base(w) == "spotrain" or base(w) in LAUNCHER_NAMES:
                    out.extend(classify(p[i:]))
                    break
        return out
    if w0 in ("docker", "podman") and len(words) > 1 and words[1] == "run":
        entry = None
        for i, w in enumerate(words[2:], 2):
            if w == "--entrypoint" and i + 1 < len(words):
                entry = words[i + 1]
            elif w.startswith("--entrypoint="):
                entry = w.split("=", 1)[1]
            elif IMAGE_RE.match(w) and not words[i - 1] in ("--entrypoint", "-t", "--tag"):
                args = words[i + 1:] or ["--help"]  # the image's CMD
                return classify([entry or "spotrain"] + args)
        return []
    if re.match(r"^python3?(\.\d+)?$", w0) and len(words) > 1 and words[1].endswith(".py"):
        return [("script", words[1:])]
    if is_script(words[0]):
        return [("script", words)]
    return []


def is_candidate_text(text):
    """Whether a line's first word (prompts and assignments aside) is a command we check."""
    t = re.sub(r"^\s*[$+]\s+", "", text)
    try:
        words = split_words(t)
    except ValueError:
        words = t.split()
    for c in simple_commands(words):
        if classify(strip_prefix(c)[1]):
            return True
    return False


def collect():
    """All command lines: a list of Cmd."""
    cmds = []
    docs = [os.path.join(SRC, "README.md"), os.path.join(SRC, "bench/README.md")]
    docs += sorted(glob.glob(os.path.join(SRC, "docs/*.md")))
    docs += sorted(glob.glob(os.path.join(SRC, "examples/**/*.md"), recursive=True))
    for path in docs:
        if not os.path.isfile(path):
            continue
        for block in markdown_blocks(path):
            cmds.extend(block_commands(rel(path), block))
    others = sorted(glob.glob(os.path.join(SRC, "examples/**/*.toml"), recursive=True))
    others += sorted(p for p in glob.glob(os.path.join(SRC, "examples/*/launch/*"))
                     if os.path.isfile(p))
    for path in others:
        for block in comment_lines(path):
            cmds.extend(block_commands(rel(path), block))
    return cmds


def block_commands(relpath, block):
    """The commands of one code block (a list of (lineno, text), continuations not joined)."""
    # Comment lines of a shell block are not commands.
    block = [(no, t) for no, t in block if not re.match(r"^\s*#", t)]
    synopsis = any(SYNOPSIS_RE.search(t) for _, t in block) and \
        any(is_candidate_text(t) for _, t in block)
    out = []
    if synopsis:
        # A usage summary: a command's line and the lines below it indented deeper that do not
        # start a command of their own.
        head = None
        for no, t in block:
            indent = len(t) - len(t.lstrip())
            if head is not None and indent > head[2] and not is_candidate_text(t):
                head[1] += " " + t.strip().rstrip("\\")
                continue
            if head is not None:
                out.append(Cmd("%s:%d" % (relpath, head[0]), head[1], synopsis=True))
                head = None
            if t.strip() and is_candidate_text(t):
                head = [no, t.strip().rstrip("\\").strip(), indent]
        if head is not None:
            out.append(Cmd("%s:%d" % (relpath, head[0]), head[1], synopsis=True))
        return out
    for no, text in join_continued(block):
        if text.strip() and is_candidate_text(text):
            out.append(Cmd("%s:%d" % (relpath, no), " ".join(text.split())))
    return out


# ---------------------------------------------------------------- running

TMP = tempfile.mkdtemp(prefix="spotrain-doc-commands-")


def run(argv, env=None, timeout=TIMEOUT_S):
    try:
        p = subprocess.run(argv, cwd=SRC, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %d s" % timeout
    except OSError as e:
        return 127, "", str(e)


def first_error(out, err):
    lines = [l for l in err.splitlines() if l.strip()]
    for l in lines:
        if l.lstrip().startswith("error"):
            return l.strip()
    lines = lines or [l for l in out.splitlines() if l.strip()]
    return lines[0].strip() if lines else "(no output)"


_generated_config = None


def generated_config():
    """A run folder's config.toml as a run writes it: `train --dry-run`'s settings."""
    global _generated_config
    if _generated_config is None:
        rc, out, err = run([SPOTRAIN, "train", "--dry-run"])
        if rc != 0:
            raise RuntimeError("train --dry-run failed: " + first_error(out, err))
        _generated_config = os.path.join(TMP, "config.toml")
        with open(_generated_config, "w") as f:
            f.write(out)
    return _generated_config


def fill(args):
    """Arguments as run: `...` dropped, placeholders filled, a run folder's config replaced."""
    out = []
    for a in args:
        if a in ("...", "\u2026"):
            continue
        out.append(PLACEHOLDERS.get(a, a))
    for i, a in enumerate(out):
        name, eq, value = a.partition("=")
        if name in MACHINE_BOUND:
            if not eq and i + 1 < len(out):
                value = out[i + 1]
            if value.isdigit() and int(value) > MACHINE_SAFE:
                if eq:
                    out[i] = "%s=%d" % (name, MACHINE_SAFE)
                else:
                    out[i + 1] = str(MACHINE_SAFE)
    for i, a in enumerate(out):
        path = None
        if a == "--config" and i + 1 < len(out):
            path, at = out[i + 1], i + 1
        elif a.startswith("--config="):
            path, at = a.split("=", 1)[1], i
        if path is not None and os.path.basename(path) == "config.toml" and \
                not os.path.exists(os.path.join(SRC, path)):
            out[at] = generated_config() if at == i + 1 else "--config=" + generated_config()
    return out


def check_spotrain(words):
    args = fill(words[1:])
    rc, out, err = run([SPOTRAIN] + args + ["--dry-run"])
    if rc == 0:
        return None
    error = first_error(out, err)
    reads = READS_INPUTS.get(tuple(args[:2]))
    if rc == 1 and reads and any(a in error for a in args[2:] if not a.startswith("-")):
        return Note("%s; not there: %s" % (reads, error))
    return "exit %d: %s" % (rc, error)


def check_train_args(args, what):
    rc, out, err = run([SPOTRAIN, "train"] + fill(args) + ["--dry-run"])
    if rc != 0:
        return "%s: spotrain train --dry-run exit %d: %s" % (what, rc, first_error(out, err))
    return None


def check_launcher(words, line_env):
    args = fill(words[1:])
    if len(args) < 2:
        return "the launcher needs HOSTFILE and NP (got %r)" % " ".join(args)
    hostfile, np_ = args[0], args[1]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(line_env)
    env["DRY_RUN"] = "1"
    env["SPOTRAIN"] = SPOTRAIN
    if "MPIRUN" not in line_env and shutil.which("mpirun") is None:
        env["MPIRUN"] = "true"  # only `command -v` sees it in a dry run
    try:
        per_node = max(1, int(env.get("RANKS_PER_NODE", "1")))
        hosts = max(int(env.get("MIN_HOSTS", "1")), math.ceil(int(np_) / per_node))
    except ValueError:
        per_node, hosts = 1, 1  # the launcher refuses the value itself
    hosts = min(hosts, 4096)
    names = ["node%04d" % i for i in range(1, hosts + 1)]
    if "HOST_DISCOVERY" in line_env:
        listing = os.path.join(TMP, "discovered-%d" % hosts)
        with open(listing, "w") as f:
            f.write("".join(n + "\n" for n in names))
        env["HOST_DISCOVERY"] = "cat " + shlex.quote(listing)
    elif hostfile != "-" and not hostfile.startswith("-") and \
            not os.path.isfile(os.path.join(SRC, hostfile)):
        path = os.path.join(TMP, "hosts-%d-%d" % (hosts, per_node))
        with open(path, "w") as f:
            f.write("".join("%s slots=%d\n" % (n, per_node) for n in names))
        args = [path] + args[1:]
    rc, out, err = run([LAUNCHER] + args, env=env)
    if rc != 0:
        return "mpirun.sh DRY_RUN=1 exit %d: %s" % (rc, first_error(out, err))
    printed = [l for l in out.splitlines() if l.startswith("+ ")]
    if not printed:
        return "mpirun.sh printed no `+ mpirun ...` line"
    cmd = shlex.split(printed[-1][2:])
    for i in range(len(cmd) - 1):
        if cmd[i] == SPOTRAIN and cmd[i + 1] == "train":
            return check_train_args(cmd[i + 2:], "the ranks' command")
    return "the printed mpirun command does not run `%s train`" % SPOTRAIN


def sbatch_default_args(script):
    """The `args=(...)` a Slurm script uses when given no arguments (None: not found)."""
    m = re.search(r"^\s*args=\((--[^)]*)\)\s*$", open(script).read(), re.M)
    return shlex.split(m.group(1)) if m else None


def sbatch_script(words):
    for i, w in enumerate(words[1:], 1):
        if w.endswith(".sbatch") or (not w.startswith("-") and os.path.isfile(os.path.join(SRC, w))):
            return i
    return None


def check_sbatch(words):
    i = sbatch_script(words)
    if i is None:
        return "no batch script on the line"
    script = os.path.join(SRC, words[i])
    if not os.path.isfile(script):
        return "%s does not exist" % words[i]
    args = words[i + 1:]
    what = "its arguments"
    if not [a for a in args if a not in ("...", "\u2026")]:
        default = sbatch_default_args(script)
        if default is not None:
            args, what = default, "the script's default arguments"
    return check_train_args(args, what)


def script_path(words):
    return os.path.join(SRC, re.sub(r"^\./", "", words[0]))


def check_script(words, text=None):
    path = script_path(words)
    if not os.path.isfile(path):
        return "%s does not exist" % words[0]
    source = open(path, encoding="utf-8", errors="replace").read()
    # The scripts it names (the one it passes its extra arguments to).
    named = set(re.findall(r"\b((?:bench|scripts|tests)/[\w.-]+\.(?:py|sh))\b", source))
    sources = [source] + [open(os.path.join(SRC, n), encoding="utf-8", errors="replace").read()
                          for n in sorted(named) if os.path.isfile(os.path.join(SRC, n))]
    opts = OPTION_RE.findall(text if text is not None else " ".join(words[1:]))
    missing = [o for o in dict.fromkeys(opts)
               if not any(re.search(re.escape(o) + r"(?![\w-])", s) for s in sources)]
    if missing:
        return "%s does not take %s" % (words[0], ", ".join(missing))
    return None


_help = {}


def cli_help(path):
    """(options, subcommands, {option: its choices}) of `spotrain PATH... --help`; None when
    it fails."""
    key = tuple(path)
    if key not in _help:
        rc, out, err = run([SPOTRAIN] + list(path) + ["--help"])
        if rc != 0:
            _help[key] = None
        else:
            opts, subs, choices, section = set(), [], {}, None
            for line in out.splitlines():
                if re.match(r"^\S.*:$", line):
                    section = line[:-1]
                    continue
                m = re.match(r"^\s{1,6}(\S+)", line)
                if not m:
                    continue
                if section == "Options" and m.group(1).startswith("-"):
                    names = [o.split("=")[0] for o in re.sub(r"\{.*\}$", "", m.group(1)).split(",")]
                    opts.update(names)
                    c = re.match(r"^\s+\S+\s+\w+:\{([^}]*)\}", line)  # --device TEXT:{auto,cpu,cuda}
                    for n in names if c else []:
                        choices[n] = set(c.group(1).split(","))
                elif section == "Subcommands":
                    subs.append(m.group(1))
            _help[key] = (opts, subs, choices)
    return _help[key]


def check_synopsis(kind, words, text):
    if kind == "spotrain":
        top = cli_help([])
        sub = words[1] if len(words) > 1 else ""
        if top is None or sub not in top[1]:
            return "`spotrain %s` is not a subcommand" % sub
        sub_help = cli_help([sub])
        known, choices = set(top[0]) | set(sub_help[0]), dict(sub_help[2])
        for s in sub_help[1]:
            h = cli_help([sub, s])
            if h:
                known |= h[0]
                choices.update(h[2])
        problems = []
        # `spotrain data pack ... | verify OUT`: the alternatives are its subcommands.
        if sub_help[1]:
            after = text.split(None, 2)[2] if len(text.split()) > 2 else ""
            named = [after.split()[0]] if after.split() else []
            named += re.findall(r"\s\|\s+([a-z][\w-]*)", after)
            problems += ["no `spotrain %s %s`" % (sub, n) for n in named if n not in sub_help[1]]
        problems += ["no %s" % o for o in dict.fromkeys(OPTION_RE.findall(text)) if o not in known]
        # `--device auto|cpu|cuda`: each alternative one of the option's choices.
        for o, alts in re.findall(r"(?<![\w-])(--[\w-]+)\s+(\S+\|\S+)", text):
            bad = [a for a in alts.split("|") if o in choices and a not in choices[o]]
            if bad:
                problems.append("%s takes no %s (its choices: %s)"
                                % (o, ", ".join(bad), ",".join(sorted(choices[o]))))
        if problems:
            return "spotrain %s --help: %s" % (sub, "; ".join(problems))
        return None
    if kind == "launcher":
        if base(words[0]) == "mpirun.sh" and not os.path.isfile(os.path.join(SRC, words[0])):
            return "%s does not exist" % words[0]
        rc, out, err = run([LAUNCHER, "--help"])
        usage = " ".join(text.split()[text.split().index(words[0]) + 1:]) \
            if words[0] in text.split() else ""
        if usage and usage not in " ".join((out + err).split()):
            return "mpirun.sh --help does not show `%s`" % usage
        return None
    if kind == "sbatch":
        i = sbatch_script(words)
        if i is None or not os.path.isfile(os.path.join(SRC, words[i])):
            return "no batch script of the repository on the line"
        return None
    if kind == "script":
        return check_script(words, text)
    return "unknown kind"


def analyze(cmd):
    """[(kind, error or None)] for one Cmd."""
    text = re.sub(r"^\s*[$+]\s+", "", cmd.text)
    if cmd.synopsis:
        env, words = strip_prefix(text.split())
        kinds = classify(words)
        return [(k, check_synopsis(k, w, text)) for k, w in kinds]
    try:
        all_words = split_words(text)
    except ValueError as e:
        return [("spotrain", "cannot split the line into words: %s" % e)]
    results = []
    for simple in simple_commands(all_words):
        env, words = strip_prefix(simple)
        for kind, w in classify(words):
            if kind == "spotrain":
                err = check_spotrain(w)
            elif kind == "launcher":
                err = check_launcher(w, env)
            elif kind == "sbatch":
                err = check_sbatch(w)
            else:
                err = check_script(w)
            results.append((kind, err))
    return results


def check_mpijob(path, report):
    """The launcher (or spotrain) container commands of a Kubernetes manifest."""
    try:
        import yaml
    except ImportError:
        print("note: %s not checked (no PyYAML for /usr/bin/python3)" % rel(path))
        return
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")

    def containers(node):
        if isinstance(node, dict):
            if isinstance(node.get("command"), list):
                yield node
            for v in node.values():
                yield from containers(v)
        elif isinstance(node, list):
            for v in node:
                yield from containers(v)

    for doc in yaml.safe_load_all(text):
        for c in containers(doc):
            argv = [str(x) for x in c["command"]] + [str(x) for x in c.get("args") or []]
            starts = [i for i, w in enumerate(argv) if base(w) in ("spotrain",) + LAUNCHER_NAMES]
            if not starts:
                continue
            words = argv[starts[0]:]
            env = {e["name"]: str(e["value"]) for e in c.get("env") or []
                   if isinstance(e, dict) and "value" in e}
            no = next((n for n, l in enumerate(lines, 1)
                       if "command:" in l and base(words[0]) in l), 0)
            where = "%s:%d" % (rel(path), no)
            shown = " ".join(["%s=%s" % (k, shlex.quote(v)) for k, v in env.items()
                              if k in LAUNCHER_VARS] + [shlex.quote(w) for w in words])
            if base(words[0]) == "spotrain":
                report(where, "spotrain", shown, check_spotrain(words))
            else:
                report(where, "launcher", shown, check_launcher(words, env))


def recipe_sections(path):
    return set(re.findall(r"^\s*\[([\w.-]+)\]", open(path, encoding="utf-8").read(), re.M))


def main():
    if not os.access(SPOTRAIN, os.X_OK):
        sys.exit("error: %s is not an executable" % SPOTRAIN)
    counts = {"ok": 0, "fail": 0, "skip": 0}
    run_count = [0]
    failures = []

    def report(where, kind, text, err, counted=True):
        if counted and kind in ("spotrain", "launcher", "sbatch", "recipe"):
            run_count[0] += 1
        if err is None or isinstance(err, Note):
            counts["ok"] += 1
            print("%s: OK %s: %s" % (where, kind, text), flush=True)
            if err is not None:
                print("    (%s)" % err, flush=True)
        else:
            counts["fail"] += 1
            line = "%s: FAIL %s: %s\n    -> %s" % (where, kind, text, err)
            failures.append(line)
            print(line, flush=True)

    allow_used = set()
    for cmd in collect():
        key = next((k for k in ALLOW if cmd.where.startswith(k[0] + ":") and k[1] in cmd.text), None)
        if key is not None:
            allow_used.add(key)
            counts["skip"] += 1
            print("%s: SKIP (%s): %s" % (cmd.where, ALLOW[key], cmd.text), flush=True)
            continue
        results = analyze(cmd)
        for k, (kind, err) in enumerate(results, 1):
            label = kind + (" usage" if cmd.synopsis else "")
            where = cmd.where if len(results) == 1 else "%s (%d/%d)" % (cmd.where, k, len(results))
            report(where, label, cmd.text, err, counted=not cmd.synopsis)

    for path in sorted(glob.glob(os.path.join(SRC, "examples/**/mpijob*.yaml"), recursive=True)):
        check_mpijob(path, report)

    for path in sorted(glob.glob(os.path.join(SRC, "examples/**/*.toml"), recursive=True)):
        if any(l.strip() == "[[offer]]" for l in open(path)):  # a catalog of offers for `spotrain plan`
            rc, out, err = run([SPOTRAIN, "plan", "--catalog", rel(path), "--epochs", "1", "--max-hosts", "1"])
            report(rel(path), "catalog", "spotrain plan --catalog %s --epochs 1 --max-hosts 1" % rel(path),
                   None if rc == 0 else "exit %d: %s" % (rc, first_error(out, err)))
            continue
        sections = recipe_sections(path)
        sub = "bench" if "bench" in sections and "train" not in sections else "train"
        rc, out, err = run([SPOTRAIN, sub, "--config", rel(path), "--dry-run"])
        report(rel(path), "recipe", "spotrain %s --config %s --dry-run" % (sub, rel(path)),
               None if rc == 0 else "exit %d: %s" % (rc, first_error(out, err)))

    for key in ALLOW:
        if key not in allow_used:
            line = "stale ALLOW entry %r: no such command any more" % (key,)
            failures.append(line)
            print(line)

    print("\n%d commands checked (%d run with --dry-run or DRY_RUN=1): %d OK, %d failed, %d skipped"
          % (counts["ok"] + counts["fail"], run_count[0], counts["ok"], counts["fail"],
             counts["skip"]))
    if run_count[0] < MIN_CHECKS:
        failures.append("only %d commands run, fewer than %d: the extraction found too few"
                        % (run_count[0], MIN_CHECKS))
        print(failures[-1])
    if failures:
        print("\n%d failure(s):" % len(failures))
        for f in failures:
            print(f)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
