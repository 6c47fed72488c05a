#!/usr/bin/python3
"""Side-by-side training-step throughput and peak memory: spotrain vs PyTorch (CPU).

For each case it runs `spotrain bench` and a PyTorch worker per memory layout (this script
re-invoked with --torch-worker, one subprocess per measurement so peak RSS is separate): the
default contiguous NCHW format and channels_last, since which one is faster depends on the
PyTorch build and CPU. All runs use the same thread count, batch, image size and precision.
It prints images/s and peak RSS for every run, the ratio ours / fastest PyTorch layout, and
the memory ratio against that same (fastest) PyTorch run. See bench/README.md.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

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

def torch_worker(a):
    """One measurement in this process; prints one JSON object on stdout."""
    import torch
    sys.path.insert(0, HERE)
    from torch_models import build

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tag = f"torch {a.model} {a.precision} {a.memory_format}"

    model = build(a.model, num_classes=a.num_classes, in_channels=a.channels)
    x = torch.randn(a.batch_size, a.channels, a.image_size, a.image_size)
    if a.memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    y = torch.randint(0, a.num_classes, (a.batch_size,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    crit = torch.nn.CrossEntropyLoss()
    bf16 = a.precision == "bf16"

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

    losses = []
    for i in range(a.warmup):
        t0 = time.perf_counter()
        losses.append(step())
        log(f"{tag}: warmup {i + 1}/{a.warmup} {time.perf_counter() - t0:.2f} s")
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        losses.append(step())
        dt = time.perf_counter() - t0
        times.append(dt)
        log(f"{tag}: step {i + 1}/{a.steps} {dt:.2f} s ({a.batch_size / dt:.1f} img/s)")

    ips = [a.batch_size / t for t in times]
    result = {
        "images_per_sec": statistics.median(ips),
        "images_per_sec_p10": percentile(ips, 10),
        "images_per_sec_p90": percentile(ips, 90),
        "step_seconds_median": statistics.median(times),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "threads": torch.get_num_threads(),
        "memory_format": a.memory_format,
        "torch_version": torch.__version__,
    }
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


def child_env(threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    # Some machines here pin OpenBLAS to an older core type (OPENBLAS_CORETYPE, with
    # OPENBLAS_L2_SIZE) for old numpy builds; that slows PyTorch's BLAS paths, so both
    # are unset for the measured processes. Neither affects spotrain (oneDNN).
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def run_torch(case, a, layout):
    c = CASES[case]
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker",
           "--model", c["model"], "--batch-size", str(c["batch_size"]),
           "--image-size", str(c["image_size"]), "--channels", str(c["channels"]),
           "--num-classes", str(c["num_classes"]), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads), "--precision", a.precision,
           "--memory-format", layout]
    log(f"PyTorch {case} {a.precision} {layout}: starting worker")
    with tempfile.TemporaryFile(mode="w+") as out:
        rc, rss = run_child(cmd, child_env(a.threads), out)
        out.seek(0)
        text = out.read()
    if rc != 0:
        return None, f"PyTorch worker exited with code {rc}"
    try:
        res = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
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


# --------------------------------------------------------------------------- report

def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(v, spec, missing="n/a"):
    return missing if v is None else format(v, spec)


def ips_spec(v):
    return ".2f" if v is not None and v < 10 else ".1f"


def fastest_torch(r):
    """(layout, result) of the PyTorch run with the highest images/s for this case, or (None, {})."""
    ok = [(l, t) for l, t in r["torch"].items() if t and t.get("images_per_sec")]
    return max(ok, key=lambda lt: lt[1]["images_per_sec"]) if ok else (None, {})


def ratio_cell(v, best_layout):
    return "n/a" if v is None else f"{v:.2f}x ({LAYOUTS[best_layout]})"


def header_for(layouts):
    return (["case", "precision", "ours img/s"]
            + [f"torch {LAYOUTS[l]} img/s" for l in layouts]
            + ["ratio vs best torch", "ours peak RSS (GiB)"]
            + [f"torch {LAYOUTS[l]} RSS (GiB)" for l in layouts]
            + ["mem ratio vs fastest torch"])


def rows_for(results, layouts):
    rows = []
    for r in results:
        ours = r["ours"] or {}
        oi, om = ours.get("images_per_sec"), ours.get("peak_rss_bytes")
        runs = [r["torch"].get(l) or {} for l in layouts]
        tis = [t.get("images_per_sec") for t in runs]
        tms = [t.get("peak_rss_bytes") for t in runs]
        best = r.get("best_torch_layout")
        rows.append(
            [r["case"], r["precision"], fmt(oi, ips_spec(oi))]
            + [fmt(ti, ips_spec(ti)) for ti in tis]
            + [ratio_cell(r.get("images_per_sec_ratio"), best),
               fmt(om / GIB if om else None, ".2f")]
            + [fmt(tm / GIB if tm else None, ".2f") for tm in tms]
            + [ratio_cell(r.get("peak_rss_ratio"), best)])
    return rows


def print_table(results, layouts):
    header, rows = header_for(layouts), rows_for(results, layouts)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def layouts_text(layouts):
    names = {"nchw": "NCHW (default contiguous)", "channels_last": "channels_last"}
    return " and ".join(names[l] for l in layouts)


def print_markdown(results, meta, layouts):
    header = header_for(layouts)
    print()
    print(f"<!-- bench/compare_pytorch.py, {meta['date']}: {meta['cpu']}, {meta['threads']} threads, "
          f"{meta['steps']} timed steps after {meta['warmup']} warmup, median; "
          f"PyTorch {meta['torch_version']}, layouts run: {layouts_text(layouts)}; "
          f"ratios are ours / the fastest PyTorch layout (named in brackets) -->")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|")
    for r in rows_for(results, layouts):
        print("| " + " | ".join(r) + " |")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


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
    asked = [l.strip() for l in a.torch_layouts.split(",") if l.strip()]
    bad = [l for l in asked if l not in LAYOUTS]
    if bad or not asked:
        ap.error(f"unknown layout(s) {', '.join(bad) or '(none)'} in --torch-layouts; "
                 f"choose from {', '.join(LAYOUTS)}")
    layouts = [l for l in LAYOUTS if l in asked]  # fixed column order, no duplicates

    failed = False
    binary = find_binary(a.spotrain)
    if binary is None:
        log(f"ERROR: spotrain binary not found or not executable: {a.spotrain!r} "
            f"(build it first, or pass --spotrain PATH); printing PyTorch numbers only")
        failed = True

    results = []
    torch_version = None
    # Rounds alternate the two sides (ours, then each PyTorch layout, then ours again ...), so
    # that a ratio is taken under the same machine conditions; each round is a row.
    for rnd, case in [(rnd, case) for rnd in range(a.rounds) for case in cases]:
        label = case if a.rounds == 1 else f"{case} r{rnd + 1}"
        r = {"case": label, "round": rnd + 1, "precision": a.precision, **CASES[case], "ours": None,
             "torch": {l: None for l in layouts}}
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
        for layout in layouts:
            r["torch"][layout], err = run_torch(case, a, layout)
            if err:
                log(f"ERROR: {case} {layout}: {err}")
                r.setdefault("torch_errors", {})[layout], failed = err, True
            else:
                t = r["torch"][layout]
                torch_version = t.get("torch_version")
                log(f"PyTorch {case} {layout}: {t['images_per_sec']:.1f} img/s, "
                    f"peak RSS {t['peak_rss_bytes'] / GIB:.2f} GiB")
        ours = r["ours"] or {}
        best, bt = fastest_torch(r)
        r["best_torch_layout"] = best
        # headline ratios: ours / the fastest PyTorch layout (speed), and ours / that same run (memory)
        r["images_per_sec_ratio"] = ratio(ours.get("images_per_sec"), bt.get("images_per_sec"))
        r["peak_rss_ratio"] = ratio(ours.get("peak_rss_bytes"), bt.get("peak_rss_bytes"))
        r["ratios_by_layout"] = {
            l: {"images_per_sec_ratio": ratio(ours.get("images_per_sec"), (t or {}).get("images_per_sec")),
                "peak_rss_ratio": ratio(ours.get("peak_rss_bytes"), (t or {}).get("peak_rss_bytes"))}
            for l, t in r["torch"].items()}
        results.append(r)

    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(),
            "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "precision": a.precision,
            "rounds": a.rounds,
            "torch_version": torch_version, "torch_layouts": layouts, "spotrain": binary or a.spotrain}
    print_table(results, layouts)
    if binary is None:
        print(f"\nspotrain binary not found at {a.spotrain!r}: only PyTorch numbers above.")
    if a.markdown:
        print_markdown(results, meta, layouts)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
            f.write("\n")
        log(f"wrote {a.json_out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
