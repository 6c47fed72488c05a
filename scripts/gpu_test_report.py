#!/usr/bin/env python3
"""Counts the gpu tests of a scripts/gpu-check.sh run by name.

Each test binary was listed (--gtest_list_tests > gpu-list-BINARY.txt) and run in GTest shards
(gpu-test-BINARY-I.log, .json from --gtest_output, .rc with the shard's exit status). A shard
that crashed writes no JSON: its log says which test was running (crashed, with the signal
from the exit status) and every test of the shard after it never ran. Prints each test that
did not pass, one per line, then the status line (what gpu-check puts in its table), last,
with the first problem in it, as a log's tail shows it; writes the same as JSON with --json.

    gpu_test_report.py LOGS_DIR [--json FILE]
"""
import argparse
import glob
import json
import os
import re
import signal
import sys

RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+)")
RUN = re.compile(r"^\[ RUN\s+\] (\S+)")


def listed_tests(path):
    """Test names in --gtest_list_tests order (the order sharding deals them out in)."""
    names, suite = [], None
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        elif suite:
            names.append(suite + line.split("#")[0].strip())
    return names


def signal_name(rc):
    if rc is None or rc <= 128:
        return ""
    try:
        return f"signal {rc - 128}, {signal.Signals(rc - 128).name}"
    except ValueError:
        return f"signal {rc - 128}"


def shard_results(log, report):
    """name -> (status, detail) from a shard's JSON report, else from its log."""
    out = {}
    if os.path.exists(report):
        try:
            data = json.load(open(report))
        except ValueError:
            data = None
        if data:
            for suite in data.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    name = f"{suite['name']}.{t['name']}"
                    if t.get("status") == "NOTRUN":
                        continue
                    if t.get("failures"):
                        first = t["failures"][0].get("failure", "").strip().splitlines()
                        out[name] = ("failed", first[0] if first else "")
                    elif t.get("result") == "SKIPPED":
                        out[name] = ("skipped", "")
                    else:
                        out[name] = ("passed", "")
            return out, True
    running = None
    if os.path.exists(log):
        for line in open(log, errors="replace"):
            m = RUN.match(line)
            if m:
                running = m.group(1)
                continue
            m = RESULT.match(line)
            if m:
                name = m.group(2).split(",")[0]
                out[name] = {"OK": ("passed", ""), "FAILED": ("failed", ""),
                             "SKIPPED": ("skipped", "")}[m.group(1)]
                if name == running:
                    running = None
    if running:
        out[running] = ("crashed", "")
    return out, False


def report(logs):
    tests = {}  # name -> (status, detail, binary)
    for lst in sorted(glob.glob(os.path.join(logs, "gpu-list-*.txt"))):
        binary = os.path.basename(lst)[len("gpu-list-"):-len(".txt")]
        names = listed_tests(lst)
        logs_of = sorted(glob.glob(os.path.join(logs, f"gpu-test-{binary}-*.log")))
        shards = len(logs_of)
        for i in range(shards):
            base = os.path.join(logs, f"gpu-test-{binary}-{i}")
            rc = None
            if os.path.exists(base + ".rc"):
                try:
                    rc = int(open(base + ".rc").read().strip())
                except ValueError:
                    rc = None
            got, whole = shard_results(base + ".log", base + ".json")
            crashed_in = None
            for name, (status, detail) in got.items():
                if status == "crashed":
                    detail = signal_name(rc) or (f"exit {rc}" if rc else "no result")
                    crashed_in = name
                tests[name] = (status, detail, binary)
            # The shard's own tests (GTest deals them out in turn) that have no result.
            for k, name in enumerate(names):
                if k % shards != i or name in tests:
                    continue
                why = (f"its shard crashed in {crashed_in}" if crashed_in else
                       "its shard ended early" + (f" ({signal_name(rc) or f'exit {rc}'})" if rc else ""))
                tests[name] = ("not run", why, binary)
        if not shards:
            for name in names:
                tests[name] = ("not run", "the binary never ran", binary)
    counts = {s: 0 for s in ("passed", "failed", "skipped", "crashed", "not run")}
    for status, _, _ in tests.values():
        counts[status] += 1
    bad = counts["failed"] + counts["crashed"] + counts["not run"]
    line = ("ok: " if not bad and tests else "FAILED: ") + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n or s in ("passed", "failed", "skipped"))
    problems = [{"test": n, "status": s, "detail": d, "binary": b}
                for n, (s, d, b) in sorted(tests.items()) if s not in ("passed", "skipped")]
    # The first problem in the status line: a crash first (it hides the tests after it), then
    # a failure, then a test that never ran.
    order = {"crashed": 0, "failed": 1, "not run": 2}
    if problems:
        p = min(problems, key=lambda p: order[p["status"]])
        line += f"; first {p['status']}: {p['test']}" + (f" ({p['detail']})" if p["detail"] else "")
    if not tests:
        line = "FAILED: no gpu test listed"
    return line, counts, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs")
    ap.add_argument("--json")
    a = ap.parse_args()
    line, counts, problems = report(a.logs)
    for p in problems:
        print(f"  {p['status']}: {p['test']}" + (f" ({p['detail']})" if p["detail"] else ""))
    print(line)
    if a.json:
        json.dump({"status": line, "counts": counts, "problems": problems}, open(a.json, "w"),
                  indent=2)
    return 0 if line.startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
