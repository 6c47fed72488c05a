#!/usr/bin/python3
"""Side-by-side training-step throughput and peak memory: spotrain vs PyTorch (CPU).

For each case it runs `spotrain bench` and a PyTorch worker (this script re-invoked with
--torch-worker, one subprocess per measurement so peak RSS is separate), both with the same
thread count, batch, image size and precision, and prints images/s and peak RSS with the
ratios ours / PyTorch. See bench/README.md for command lines.
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
    tag = f"torch {a.model} {a.precision}"

    model = build(a.model, num_classes=a.num_classes, in_channels=a.channels)
    model = model.to(memory_format=torch.channels_last)
    model.train()
    x = torch.randn(a.batch_size, a.channels, a.image_size, a.image_size)
    x = x.contiguous(memory_format=torch.channels_last)
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
    return env


def run_torch(case, a):
    c = CASES[case]
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker",
           "--model", c["model"], "--batch-size", str(c["batch_size"]),
           "--image-size", str(c["image_size"]), "--channels", str(c["channels"]),
           "--num-classes", str(c["num_classes"]), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads), "--precision", a.precision]
    log(f"PyTorch {case} {a.precision}: starting worker")
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


def rows_for(results):
    rows = []
    for r in results:
        ours, torch_ = r["ours"] or {}, r["torch"] or {}
        oi, ti = ours.get("images_per_sec"), torch_.get("images_per_sec")
        om, tm = ours.get("peak_rss_bytes"), torch_.get("peak_rss_bytes")
        rows.append([
            r["case"], r["precision"],
            fmt(oi, ips_spec(oi)), fmt(ti, ips_spec(ti)), fmt(ratio(oi, ti), ".2f") + ("x" if oi and ti else ""),
            fmt(om / GIB if om else None, ".2f"), fmt(tm / GIB if tm else None, ".2f"),
            fmt(ratio(om, tm), ".2f") + ("x" if om and tm else ""),
        ])
    return rows


HEADER = ["case", "precision", "ours img/s", "torch img/s", "ratio",
          "ours peak RSS (GiB)", "torch peak RSS (GiB)", "mem ratio"]


def print_table(results):
    rows = rows_for(results)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(HEADER))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def print_markdown(results, meta):
    print()
    print(f"<!-- bench/compare_pytorch.py, {meta['date']}: {meta['cpu']}, {meta['threads']} threads, "
          f"{meta['steps']} timed steps after {meta['warmup']} warmup, median; "
          f"PyTorch {meta['torch_version']}, channels_last -->")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "|".join(["---", "---"] + ["---:"] * (len(HEADER) - 2)) + "|")
    for r in rows_for(results):
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
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table for docs/PERFORMANCE.md")
    ap.add_argument("--json-out", metavar="FILE", help="write all results as JSON to FILE")
    # hidden worker mode: one PyTorch measurement, JSON on stdout
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--channels", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--num-classes", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.threads < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--threads and --steps must be >= 1, --warmup >= 0")
    if a.torch_worker:
        if None in (a.model, a.batch_size, a.image_size, a.channels, a.num_classes):
            ap.error("--torch-worker needs --model --batch-size --image-size --channels --num-classes")
        return torch_worker(a)

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        ap.error(f"unknown case(s) {', '.join(bad) or '(none)'}; choose from {', '.join(CASES)}")

    failed = False
    binary = find_binary(a.spotrain)
    if binary is None:
        log(f"ERROR: spotrain binary not found or not executable: {a.spotrain!r} "
            f"(build it first, or pass --spotrain PATH); printing PyTorch numbers only")
        failed = True

    results = []
    torch_version = None
    for case in cases:
        r = {"case": case, "precision": a.precision, **CASES[case], "ours": None, "torch": None}
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
        r["torch"], err = run_torch(case, a)
        if err:
            log(f"ERROR: {case}: {err}")
            r["torch_error"], failed = err, True
        else:
            torch_version = r["torch"].get("torch_version")
            log(f"PyTorch {case}: {r['torch']['images_per_sec']:.1f} img/s, "
                f"peak RSS {r['torch']['peak_rss_bytes'] / GIB:.2f} GiB")
        r["images_per_sec_ratio"] = ratio((r["ours"] or {}).get("images_per_sec"),
                                          (r["torch"] or {}).get("images_per_sec"))
        r["peak_rss_ratio"] = ratio((r["ours"] or {}).get("peak_rss_bytes"),
                                    (r["torch"] or {}).get("peak_rss_bytes"))
        results.append(r)

    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(),
            "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "precision": a.precision,
            "torch_version": torch_version, "spotrain": binary or a.spotrain}
    print_table(results)
    if binary is None:
        print(f"\nspotrain binary not found at {a.spotrain!r}: only PyTorch numbers above.")
    if a.markdown:
        print_markdown(results, meta)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
            f.write("\n")
        log(f"wrote {a.json_out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
