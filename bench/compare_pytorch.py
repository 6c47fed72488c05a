#!/usr/bin/python3
"""Side-by-side training-step throughput and peak memory: spotrain vs PyTorch (CPU).

For each case it runs `spotrain bench` and a PyTorch worker per memory layout (this script
re-invoked with --torch-worker, one subprocess per measurement so peak RSS is separate): the
default contiguous NCHW format and channels_last, since which one is faster depends on the
PyTorch build and CPU. All runs use the same thread count, batch, image size and precision.
It prints images/s and peak RSS for every run, the ratio ours / fastest PyTorch run, and
the memory ratio against that same (fastest) PyTorch run and against the leanest one.

Optionally the PyTorch workers run under another interpreter (--torch-python, e.g. a venv
with the newest PyTorch), in several modes per layout (--torch-modes eager,compile,
compile-max-autotune: torch.compile of the model), and a second PyTorch is measured as a
reference column (--baseline-python, eager only, e.g. Debian's 1.13). See bench/README.md.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GIB = 1024.0 ** 3

# case name -> what both sides train
CASES = {
    "resnet50": dict(model="resnet50", image_size=224, channels=3, batch_size=32, num_classes=1000),
    "fmnist": dict(model="resnet20", image_size=28, channels=1, batch_size=128, num_classes=10),
}


# PyTorch memory layouts: CLI name -> short label for the table
LAYOUTS = {"nchw": "NCHW", "channels_last": "CL"}

# PyTorch execution modes: CLI name -> torch.compile keyword arguments (None: eager, no compile)
MODES = {"eager": None, "compile": {}, "compile-max-autotune": {"mode": "max-autotune"}}


def log(msg):
    print(f"[compare_pytorch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values, q):
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# --------------------------------------------------------------------------- PyTorch worker

def cpu_capability(torch):
    """The ATen CPU kernel level in use (AVX2, AVX512, ...), or None if it can't be told."""
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get is not None:
        try:
            return get()
        except Exception:  # noqa: BLE001 -- informational only
            pass
    try:
        for ln in torch.__config__.show().splitlines():
            if "CPU capability usage:" in ln:
                return ln.split(":", 1)[1].strip()
    except Exception:  # noqa: BLE001
        pass
    return None


def torch_worker(a):
    """One measurement in this process; prints one JSON object on stdout (with an "error"
    key and exit code 1 if the model could not be compiled or a step failed)."""
    import torch
    sys.path.insert(0, HERE)
    from torch_models import build
    # what the interpreter and the libraries cost before any tensor (a CUDA wheel from PyPI
    # maps much more than a CPU-only build)
    import_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tag = f"torch {torch.__version__} {a.model} {a.precision} {a.memory_format} {a.mode}"
    ident = {"memory_format": a.memory_format, "mode": a.mode, "python": sys.executable,
             "torch_version": torch.__version__}

    def fail(what, e):
        if sys.exc_info()[0] is not None:
            traceback.print_exc()  # the whole story on stderr, its first line in the JSON
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        msg = f"{what}: {type(e).__name__}: {lines[0] if lines else ''}"[:400]
        log(f"{tag}: ERROR {msg}")
        print(json.dumps({**ident, "error": msg}), flush=True)
        return 1

    model = build(a.model, num_classes=a.num_classes, in_channels=a.channels)
    x = torch.randn(a.batch_size, a.channels, a.image_size, a.image_size)
    if a.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    y = torch.randint(0, a.num_classes, (a.batch_size,))
    # the optimizer holds the module's own parameters (a compiled wrapper shares them) and
    # its step stays eager
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    crit = torch.nn.CrossEntropyLoss()
    bf16 = a.precision == "bf16"

    compile_kw = MODES[a.mode]
    t_compile = 0.0
    if compile_kw is not None:
        if not hasattr(torch, "compile"):
            return fail(f"torch.compile ({a.mode})",
                        RuntimeError(f"torch {torch.__version__} has no torch.compile (needs 2.0+)"))
        t0 = time.perf_counter()
        try:
            model = torch.compile(model, **compile_kw)
        except Exception as e:  # noqa: BLE001 -- reported as this variant's failure
            return fail(f"torch.compile ({a.mode})", e)
        t_compile = time.perf_counter() - t0

    def step():
        opt.zero_grad(set_to_none=True)
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                loss = crit(out, y)
        else:
            out = model(x)
            loss = crit(out, y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    # compiling happens in the first step (forward and backward graphs), so a compiled model
    # always gets at least that one untimed step
    warmup = a.warmup
    if compile_kw is not None and warmup < 1:
        log(f"{tag}: --warmup 0, but the first step compiles: running 1 untimed step")
        warmup = 1
    losses = []
    times = []
    compile_seconds = None
    try:
        for i in range(warmup):
            t0 = time.perf_counter()
            losses.append(step())
            dt = time.perf_counter() - t0
            if i == 0 and compile_kw is not None:
                compile_seconds = t_compile + dt
                log(f"{tag}: compiled in {compile_seconds:.1f} s (warmup step 1, compile included)")
            else:
                log(f"{tag}: warmup {i + 1}/{warmup} {dt:.2f} s")
    except Exception as e:  # noqa: BLE001
        return fail(f"torch.compile ({a.mode}), first steps" if compile_kw is not None
                    else "warmup step", e)
    try:
        for i in range(a.steps):
            t0 = time.perf_counter()
            losses.append(step())
            dt = time.perf_counter() - t0
            times.append(dt)
            log(f"{tag}: step {i + 1}/{a.steps} {dt:.2f} s ({a.batch_size / dt:.1f} img/s)")
    except Exception as e:  # noqa: BLE001
        return fail("timed step", e)

    ips = [a.batch_size / t for t in times]
    result = {
        "images_per_sec": statistics.median(ips),
        "images_per_sec_p10": percentile(ips, 10),
        "images_per_sec_p90": percentile(ips, 90),
        "step_seconds_median": statistics.median(times),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "import_rss_bytes": import_rss,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "threads": torch.get_num_threads(),
        **ident,
        "cpu_capability": cpu_capability(torch),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
    }
    if compile_kw is not None:
        result["compile_seconds"] = compile_seconds
    print(json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- subprocess helpers

def run_child(cmd, env, stdout):
    """Run cmd; return (exit code, child's own ru_maxrss in bytes). Uses wait4 so the RSS
    is this child's alone, not the maximum over every child so far (RUSAGE_CHILDREN)."""
    p = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=None)
    try:
        _, status, ru = os.wait4(p.pid, 0)
    except KeyboardInterrupt:
        p.kill()
        p.wait()
        raise
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_maxrss * 1024


def child_env(threads, extra=None):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    # Some machines here pin OpenBLAS to an older core type (OPENBLAS_CORETYPE, with
    # OPENBLAS_L2_SIZE) for old numpy builds; that slows PyTorch's BLAS paths, so both
    # are unset for the measured processes. Neither affects spotrain (oneDNN).
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env.update(extra or {})
    return env


def python_name(py):
    """A short name for an interpreter: the venv's folder name for a venv's python
    (~/.cache/spotrain/torch-venv/bin/python -> torch-venv), else the file name."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(py)))
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        return os.path.basename(venv)
    return os.path.basename(py)


def short_version(v):
    """'2.15.0+cu132' -> '2.15', '1.13.0a0' -> '1.13'."""
    return ".".join(v.split("+")[0].split(".")[:2])


def run_torch(case, a, v, env):
    """One PyTorch measurement of variant v (see make_variants) in its own subprocess."""
    c = CASES[case]
    cmd = [v["python"], os.path.abspath(__file__), "--torch-worker",
           "--model", c["model"], "--batch-size", str(c["batch_size"]),
           "--image-size", str(c["image_size"]), "--channels", str(c["channels"]),
           "--num-classes", str(c["num_classes"]), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads), "--precision", a.precision,
           "--memory-format", v["layout"], "--mode", v["mode"]]
    log(f"PyTorch {v['desc']} {case} {a.precision}: starting worker")
    with tempfile.TemporaryFile(mode="w+") as out:
        rc, rss = run_child(cmd, env, out)
        out.seek(0)
        text = out.read()
    res = None
    for ln in reversed(text.strip().splitlines()):  # the last JSON object printed
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict):
            res = obj
            break
    if res is not None and res.get("error"):
        return None, res["error"]
    if rc != 0:
        return None, f"PyTorch worker exited with code {rc}"
    if res is None or "images_per_sec" not in res:
        return None, f"PyTorch worker printed no JSON result: {text[-500:]!r}"
    res["wait4_maxrss_bytes"] = rss
    return res, None


def find_binary(path):
    cands = [path] if os.path.isabs(path) else [os.path.abspath(path), os.path.join(REPO, path)]
    for p in cands:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run_ours(case, a, binary):
    c = CASES[case]
    fd, jpath = tempfile.mkstemp(prefix=f"spotrain-bench-{case}-", suffix=".json")
    os.close(fd)
    os.unlink(jpath)  # so a stale file can't be mistaken for a result
    cmd = [binary, "bench", "--model", c["model"], "--batch-size", str(c["batch_size"]),
           "--image-size", str(c["image_size"]), "--channels", str(c["channels"]),
           "--num-classes", str(c["num_classes"]), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads),
           "--precision", a.precision, "--json", jpath]
    log(f"spotrain {case} {a.precision}: {' '.join(cmd)}")
    try:
        # its stdout goes to our stderr so the table on stdout stays clean
        rc, rss = run_child(cmd, child_env(a.threads), sys.stderr)
        if rc != 0:
            return None, f"spotrain bench exited with code {rc}"
        try:
            with open(jpath) as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            return None, f"spotrain bench wrote no readable JSON at {jpath}: {e}"
    finally:
        if os.path.exists(jpath):
            os.unlink(jpath)
    if "images_per_sec" not in res:
        return None, "spotrain bench JSON has no images_per_sec"
    res["wait4_maxrss_bytes"] = rss
    if not res.get("peak_rss_bytes"):
        res["peak_rss_bytes"] = rss  # fall back to what the kernel says
    return res, None


# --------------------------------------------------------------------------- variants

def make_variants(layouts, modes, torch_python, baseline_layouts, baseline_python, full):
    """Every PyTorch run of a round, in the order run: the main PyTorch (layout x mode),
    then the baseline (one eager run per layout). group is the result dict it lands in
    ("torch" or "baseline"), key its key there: the layout for an eager main run (as
    before --torch-modes existed) or "layout:mode", the layout for a baseline run."""
    vs = []
    for l in layouts:
        for m in modes:
            vs.append({"group": "torch", "key": l if m == "eager" else f"{l}:{m}", "layout": l,
                       "mode": m, "python": torch_python,
                       "desc": f"[{python_name(torch_python)}] {l} {m}" if full else l})
    for l in baseline_layouts:
        vs.append({"group": "baseline", "key": l, "layout": l, "mode": "eager",
                   "python": baseline_python, "desc": f"[baseline {python_name(baseline_python)}] {l}"})
    return vs


def label_variants(variants, results, full):
    """Set each variant's column label ("torch 2.15 CL compile", or "torch CL" without any
    of the new options) and short name for ratio cells ("CL compile"), using the version
    the workers reported (the interpreter's name if none of its runs succeeded)."""
    versions = {}  # group -> "2.15"
    for r in results:
        for grp in ("torch", "baseline"):
            for t in (r.get(grp) or {}).values():
                if t and t.get("torch_version"):
                    versions.setdefault(grp, short_version(t["torch_version"]))
    for v in variants:
        L = LAYOUTS[v["layout"]]
        ver = versions.get(v["group"]) or python_name(v["python"])
        if v["group"] == "baseline":
            v["short"], v["label"] = L, f"torch {ver} {L}"
        elif full:
            v["short"] = f"{L} {v['mode']}"
            v["label"] = f"torch {ver} {v['short']}"
        else:
            v["short"], v["label"] = L, f"torch {L}"


# --------------------------------------------------------------------------- report

def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(v, spec, missing="n/a"):
    return missing if v is None else format(v, spec)


def ips_spec(v):
    return ".2f" if v is not None and v < 10 else ".1f"


def pick(runs, field, best):
    """(key, result) of the run with the best (max or min) value of field, or (None, {})."""
    ok = [(k, t) for k, t in runs.items() if t and t.get(field)]
    return best(ok, key=lambda kt: kt[1][field]) if ok else (None, {})


def ratio_cell(v, name):
    return "n/a" if v is None else f"{v:.2f}x ({name})"


def short_of(variants, group, key):
    for v in variants:
        if v["group"] == group and v["key"] == key:
            return v["short"]
    return key


def header_for(variants, baseline):
    return (["case", "precision", "ours img/s"]
            + [f"{v['label']} img/s" for v in variants]
            + ["ratio vs best torch"] + (["ratio vs best baseline"] if baseline else [])
            + ["ours peak RSS (GiB)"]
            + [f"{v['label']} RSS (GiB)" for v in variants]
            + ["mem ratio vs least torch", "mem ratio vs fastest torch"])


def rows_for(results, variants, baseline):
    rows = []
    for r in results:
        ours = r["ours"] or {}
        oi, om = ours.get("images_per_sec"), ours.get("peak_rss_bytes")
        runs = [(r.get(v["group"]) or {}).get(v["key"]) or {} for v in variants]
        tis = [t.get("images_per_sec") for t in runs]
        tms = [t.get("peak_rss_bytes") for t in runs]
        best = short_of(variants, "torch", r.get("best_torch_variant"))
        least = short_of(variants, "torch", r.get("least_rss_torch_variant"))
        bbest = short_of(variants, "baseline", r.get("best_baseline_layout"))
        rows.append(
            [r["case"], r["precision"], fmt(oi, ips_spec(oi))]
            + [fmt(ti, ips_spec(ti)) for ti in tis]
            + [ratio_cell(r.get("images_per_sec_ratio"), best)]
            + ([ratio_cell(r.get("images_per_sec_ratio_vs_baseline"), bbest)] if baseline else [])
            + [fmt(om / GIB if om else None, ".2f")]
            + [fmt(tm / GIB if tm else None, ".2f") for tm in tms]
            + [ratio_cell(r.get("peak_rss_ratio_vs_least"), least),
               ratio_cell(r.get("peak_rss_ratio"), best)])
    return rows


# (summary key, results field, variant field, group, worst = min or max, column title)
SUMMARY_FIELDS = [
    ("images_per_sec_ratio", "images_per_sec_ratio", "best_torch_variant", "torch", min,
     "worst ratio vs best torch"),
    ("images_per_sec_ratio_vs_baseline", "images_per_sec_ratio_vs_baseline", "best_baseline_layout",
     "baseline", min, "worst ratio vs best baseline"),
    ("peak_rss_ratio_vs_least", "peak_rss_ratio_vs_least", "least_rss_torch_variant", "torch", max,
     "worst mem ratio vs least torch"),
    ("peak_rss_ratio", "peak_rss_ratio", "best_torch_variant", "torch", max,
     "worst mem ratio vs fastest torch"),
]


def summarize(results, variants, baseline):
    """Per case over the rounds: the lowest speed ratios and the highest memory ratios, each
    with the round and the PyTorch run it was taken against."""
    out = {}
    for case in dict.fromkeys(r["case_id"] for r in results):
        rs = [r for r in results if r["case_id"] == case]
        s = {"rounds": len(rs), "precision": rs[0]["precision"]}
        for key, field, vfield, group, worst, _ in SUMMARY_FIELDS:
            if group == "baseline" and not baseline:
                continue
            ok = [r for r in rs if r.get(field) is not None]
            if not ok:
                s[key] = None
                continue
            w = worst(ok, key=lambda r: r[field])
            s[key] = {"value": w[field], "round": w["round"], "vs": w.get(vfield),
                      "vs_label": short_of(variants, group, w.get(vfield)),
                      "rounds_measured": len(ok)}
        out[case] = s
    return out


def summary_table(summary, baseline):
    fields = [f for f in SUMMARY_FIELDS if baseline or f[3] != "baseline"]
    header = ["case", "precision", "rounds"] + [f[5] for f in fields]
    rows = []
    for case, s in summary.items():
        cells = [case, s["precision"], str(s["rounds"])]
        for key, *_ in fields:
            w = s.get(key)
            cells.append("n/a" if not w else f"{w['value']:.2f}x ({w['vs_label']}, r{w['round']})")
        rows.append(cells)
    return header, rows


def print_rows(header, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def print_markdown_rows(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def layouts_text(layouts):
    names = {"nchw": "NCHW (default contiguous)", "channels_last": "channels_last"}
    return " and ".join(names[l] for l in layouts)


def markdown_comment(meta, full):
    parts = [f"bench/compare_pytorch.py, {meta['date']}: {meta['cpu']}, {meta['threads']} threads, "
             f"{meta['steps']} timed steps after {meta['warmup']} warmup, median"]
    if full:
        if meta["rounds"] > 1:
            parts[0] += f", {meta['rounds']} rounds alternating"
        parts.append(f"PyTorch {meta['torch_version']} ({meta['torch_python']}), layouts run: "
                     f"{layouts_text(meta['torch_layouts'])}, modes: {', '.join(meta['torch_modes'])}")
        if meta.get("baseline_python"):
            parts.append(f"baseline PyTorch {meta['baseline_torch_version']} ({meta['baseline_python']}), "
                         f"eager, layouts: {layouts_text(meta['baseline_layouts'])}")
    else:
        parts.append(f"PyTorch {meta['torch_version']}, layouts run: {layouts_text(meta['torch_layouts'])}")
    cap = meta.get("aten_cpu_capability") or {}
    if cap.get("value"):
        parts.append(f"ATEN_CPU_CAPABILITY={cap['value']} ({cap['set_by']})")
    parts.append("speed ratios are ours / the fastest PyTorch run (named in brackets); "
                 "mem ratio vs least torch is against the smallest PyTorch peak RSS"
                 + (" of the main PyTorch" if meta.get("baseline_python") else ""))
    return "<!-- " + "; ".join(parts) + " -->"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_has_flag(flag):
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("flags"):
                    return flag in ln.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def aten_capability(precision):
    """(meta entry, extra env for the PyTorch workers): for bf16 on an AVX-512 CPU the workers
    get ATEN_CPU_CAPABILITY=avx512 (some builds, e.g. Debian's 1.13, default to AVX2 kernels),
    unless the user set it already."""
    user = os.environ.get("ATEN_CPU_CAPABILITY")
    if user is not None:
        return {"value": user, "set_by": "user environment"}, {}
    if precision == "bf16" and cpu_has_flag("avx512f"):
        return ({"value": "avx512", "set_by": "compare_pytorch.py: bf16 on a CPU with avx512f"},
                {"ATEN_CPU_CAPABILITY": "avx512"})
    return {"value": None, "set_by": None}, {}


def parse_list(text, allowed, opt, ap):
    asked = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in asked if x not in allowed]
    if bad or not asked:
        ap.error(f"unknown value(s) {', '.join(bad) or '(none)'} in {opt}; choose from {', '.join(allowed)}")
    return [x for x in allowed if x in asked]  # fixed column order, no duplicates


def find_python(py, opt, ap):
    found = shutil.which(py)
    if not found:
        ap.error(f"{opt} {py!r}: not found or not executable")
    return os.path.abspath(found)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Compare a training step of spotrain against PyTorch (CPU): images/s and peak RSS.")
    ap.add_argument("--spotrain", default="build/spotrain",
                    help="path to the spotrain binary (default build/spotrain, relative to cwd or repo root)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both sides (default: os.cpu_count() = %(default)s)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warmup steps (default 2)")
    ap.add_argument("--cases", default="resnet50,fmnist",
                    help="comma list of: " + ", ".join(
                        f"{k} ({v['model']} {v['image_size']}x{v['image_size']}x{v['channels']}, "
                        f"batch {v['batch_size']}, {v['num_classes']} classes)" for k, v in CASES.items())
                    + " (default: both)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="fp32, or bf16 (PyTorch: torch.autocast('cpu', dtype=torch.bfloat16))")
    ap.add_argument("--torch-layouts", metavar="LIST", default=",".join(LAYOUTS),
                    help="comma list of PyTorch memory layouts to measure, each in its own process: "
                         "nchw (default contiguous format), channels_last (default: both)")
    ap.add_argument("--torch-python", metavar="PY",
                    help="interpreter the PyTorch workers run under (default: this one, %s)" % sys.executable)
    ap.add_argument("--torch-modes", metavar="LIST", default="eager",
                    help="comma list of PyTorch modes, each run for each layout in its own process: "
                         "eager, compile (torch.compile(model)), compile-max-autotune "
                         "(torch.compile(model, mode='max-autotune')); default eager")
    ap.add_argument("--baseline-python", metavar="PY",
                    help="a second PyTorch to measure as a reference (e.g. /usr/bin/python3), eager, "
                         "one process per layout in --baseline-layouts, in each round after the main one")
    ap.add_argument("--baseline-layouts", metavar="LIST",
                    help="layouts for --baseline-python (default: same as --torch-layouts)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every case this many times, ours and PyTorch alternating (default 1)")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table for docs/PERFORMANCE.md")
    ap.add_argument("--json-out", metavar="FILE", help="write all results as JSON to FILE")
    # hidden worker mode: one PyTorch measurement, JSON on stdout
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--channels", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--num-classes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--memory-format", choices=list(LAYOUTS), default="nchw", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=list(MODES), default="eager", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.threads < 1 or a.steps < 1 or a.warmup < 0 or a.rounds < 1:
        ap.error("--threads, --steps and --rounds must be >= 1, --warmup >= 0")
    if a.torch_worker:
        if None in (a.model, a.batch_size, a.image_size, a.channels, a.num_classes):
            ap.error("--torch-worker needs --model --batch-size --image-size --channels --num-classes")
        return torch_worker(a)

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        ap.error(f"unknown case(s) {', '.join(bad) or '(none)'}; choose from {', '.join(CASES)}")
    layouts = parse_list(a.torch_layouts, list(LAYOUTS), "--torch-layouts", ap)
    modes = parse_list(a.torch_modes, list(MODES), "--torch-modes", ap)
    if a.baseline_layouts is not None and not a.baseline_python:
        ap.error("--baseline-layouts needs --baseline-python")
    baseline_layouts = (parse_list(a.baseline_layouts or a.torch_layouts, list(LAYOUTS),
                                   "--baseline-layouts", ap) if a.baseline_python else [])
    torch_python = find_python(a.torch_python, "--torch-python", ap) if a.torch_python else sys.executable
    baseline_python = find_python(a.baseline_python, "--baseline-python", ap) if a.baseline_python else None
    # any new option: columns name the PyTorch version and mode; without, the old labels
    full = bool(a.torch_python or modes != ["eager"] or baseline_python)
    variants = make_variants(layouts, modes, torch_python, baseline_layouts, baseline_python, full)
    cap_meta, cap_env = aten_capability(a.precision)
    if cap_env:
        log(f"PyTorch workers get ATEN_CPU_CAPABILITY={cap_env['ATEN_CPU_CAPABILITY']} "
            f"(bf16, CPU has avx512f; set it yourself to override)")
    torch_env = child_env(a.threads, cap_env)

    failed = False
    binary = find_binary(a.spotrain)
    if binary is None:
        log(f"ERROR: spotrain binary not found or not executable: {a.spotrain!r} "
            f"(build it first, or pass --spotrain PATH); printing PyTorch numbers only")
        failed = True

    results = []
    # Rounds alternate the sides (ours, then each PyTorch run, then the baseline runs, then
    # ours again ...), so that a ratio is taken under the same machine conditions; each
    # round is a row.
    for rnd, case in [(rnd, case) for rnd in range(a.rounds) for case in cases]:
        label = case if a.rounds == 1 else f"{case} r{rnd + 1}"
        r = {"case": label, "case_id": case, "round": rnd + 1, "precision": a.precision,
             **CASES[case], "ours": None,
             "torch": {v["key"]: None for v in variants if v["group"] == "torch"}}
        if baseline_python:
            r["baseline"] = {v["key"]: None for v in variants if v["group"] == "baseline"}
        if binary:
            r["ours"], err = run_ours(case, a, binary)
            if err:
                log(f"ERROR: {case}: {err}")
                r["ours_error"], failed = err, True
            else:
                log(f"spotrain {case}: {r['ours']['images_per_sec']:.1f} img/s, "
                    f"peak RSS {r['ours']['peak_rss_bytes'] / GIB:.2f} GiB")
        else:
            r["ours_error"] = f"binary not found: {a.spotrain}"
        for v in variants:
            t, err = run_torch(case, a, v, torch_env)
            r[v["group"]][v["key"]] = t
            if err:
                log(f"ERROR: PyTorch {v['desc']} {case}: {err}")
                r.setdefault(f"{v['group']}_errors", {})[v["key"]], failed = err, True
            else:
                comp = (f", compiled in {t['compile_seconds']:.1f} s"
                        if t.get("compile_seconds") is not None else "")
                log(f"PyTorch {v['desc']} {case}: {t['images_per_sec']:.1f} img/s, "
                    f"peak RSS {t['peak_rss_bytes'] / GIB:.2f} GiB{comp}")
        ours = r["ours"] or {}
        oi, om = ours.get("images_per_sec"), ours.get("peak_rss_bytes")
        best, bt = pick(r["torch"], "images_per_sec", max)
        least, lt = pick(r["torch"], "peak_rss_bytes", min)
        r["best_torch_layout"] = bt.get("memory_format")
        r["best_torch_variant"] = best
        r["least_rss_torch_variant"] = least
        # headline ratios: ours / the fastest main PyTorch run (speed), ours / that same run
        # (memory), and ours / the leanest main PyTorch run (memory, the strictest)
        r["images_per_sec_ratio"] = ratio(oi, bt.get("images_per_sec"))
        r["peak_rss_ratio"] = ratio(om, bt.get("peak_rss_bytes"))
        r["peak_rss_ratio_vs_least"] = ratio(om, lt.get("peak_rss_bytes"))
        by = lambda runs: {k: {"images_per_sec_ratio": ratio(oi, (t or {}).get("images_per_sec")),
                               "peak_rss_ratio": ratio(om, (t or {}).get("peak_rss_bytes"))}
                           for k, t in runs.items()}
        r["ratios_by_variant"] = by(r["torch"])
        # the eager runs by layout, as before --torch-modes existed
        r["ratios_by_layout"] = {l: q for l, q in r["ratios_by_variant"].items() if l in LAYOUTS}
        if baseline_python:
            bbest, bb = pick(r["baseline"], "images_per_sec", max)
            r["best_baseline_layout"] = bbest
            r["images_per_sec_ratio_vs_baseline"] = ratio(oi, bb.get("images_per_sec"))
            r["peak_rss_ratio_vs_baseline"] = ratio(om, bb.get("peak_rss_bytes"))
            r["baseline_ratios_by_layout"] = by(r["baseline"])
        results.append(r)

    label_variants(variants, results, full)
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(),
            "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "precision": a.precision,
            "rounds": a.rounds,
            "torch_version": next((t["torch_version"] for r in results for t in r["torch"].values()
                                   if t and t.get("torch_version")), None),
            "torch_layouts": layouts, "torch_modes": modes, "torch_python": torch_python,
            "aten_cpu_capability": cap_meta, "spotrain": binary or a.spotrain,
            "columns": {f"{v['group']}:{v['key']}": v["label"] for v in variants}}
    if baseline_python:
        meta.update(baseline_python=baseline_python, baseline_layouts=baseline_layouts,
                    baseline_torch_version=next(
                        (t["torch_version"] for r in results for t in r["baseline"].values()
                         if t and t.get("torch_version")), None))
    has_base = bool(baseline_python)
    header, rows = header_for(variants, has_base), rows_for(results, variants, has_base)
    print_rows(header, rows)
    summary = None
    if a.rounds > 1:
        summary = summarize(results, variants, has_base)
        sh, sr = summary_table(summary, has_base)
        print(f"\nworst round per case (lowest speed ratio, highest memory ratio) of {a.rounds} rounds:")
        print_rows(sh, sr)
    if binary is None:
        print(f"\nspotrain binary not found at {a.spotrain!r}: only PyTorch numbers above.")
    if a.markdown:
        print()
        print(markdown_comment(meta, full))
        print_markdown_rows(header, rows)
        if summary is not None:
            print()
            print(f"Worst round per case of {a.rounds} (lowest speed ratio, highest memory ratio):")
            print()
            print_markdown_rows(sh, sr)
    if a.json_out:
        with open(a.json_out, "w") as f:
            out = {"meta": meta, "results": results}
            if summary is not None:
                out["summary"] = summary
            json.dump(out, f, indent=2)
            f.write("\n")
        log(f"wrote {a.json_out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
