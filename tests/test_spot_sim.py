#!/usr/bin/env python3
"""The spot simulator (bench/spot_sim.py) at a small size: two hosts, two hard preemptions, a
restart after each; the job must finish on the same weights as an uninterrupted run, bit for
bit, and report a goodput between 0 and 1. The failures are drawn in steps (--mtbf-steps; seed
3 draws them 14 and 23 steps into each attempt, host 1 then host 2), so both land well before
the job's 60 steps on a fast machine as on a slow one; in seconds, a fast machine finished
before the second. (The job had 150 steps; the last attempt's 90 more tested nothing more.)
Exit 77 (skipped) where network namespaces cannot be made.

  tests/test_spot_sim.py SPOTRAIN_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    spotrain = sys.argv[1]
    if os.geteuid() != 0:
        print("skipped: needs root for network namespaces")
        return 77
    probe = subprocess.run([os.path.join(REPO, "tests", "netns_hosts.sh"), "up", "simprobe", "1"],
                           capture_output=True, text=True)
    subprocess.run([os.path.join(REPO, "tests", "netns_hosts.sh"), "down", "simprobe"], capture_output=True)
    if probe.returncode == 77:
        print("skipped: " + probe.stderr.strip())
        return 77
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.jsonl")
        r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "spot_sim.py"),
                            "--spotrain", spotrain, "--hosts", "2", "--mtbf-steps", "100", "--grace", "0",
                            "--seed", "3", "--max-preemptions", "2", "--model", "resnet20",
                            "--data", "synthetic", "--batch-size", "16", "--steps", "60",
                            "--ckpt-every", "10", "--reference", "--json", out],
                           capture_output=True, text=True, timeout=400)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            print("FAIL: spot_sim.py exited %d" % r.returncode)
            return 1
        res = json.loads(open(out).read().splitlines()[-1])
    failures = []
    if res.get("bitwise_equal") is not True:
        failures.append("the final weights differ from the uninterrupted run's")
    if not 0 < res["goodput"] < 1:
        failures.append("goodput %r is not in (0, 1)" % res["goodput"])
    if res["preemptions"] != 2 or res["hard_kills"] != 2:
        failures.append("expected 2 hard preemptions, got %d (%d hard)" % (res["preemptions"], res["hard_kills"]))
    if res["restarts"] < 2:
        failures.append("expected a restart per preemption, got %d" % res["restarts"])
    if res["steps"] != 60:
        failures.append("the surviving history has %d steps, not 60" % res["steps"])
    if res["goodput"] >= res["reference_goodput"]:
        failures.append("goodput %.3f not below the uninterrupted run's %.3f" % (res["goodput"], res["reference_goodput"]))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
