#!/usr/bin/env python3
"""An uneven fleet against an even one, on three namespace hosts (tests/netns_fleet.py) held to
their shares of a core by the kernel's CPU quota: the even fleet (every host at 0.4 of a core),
and with the third host at 0.2 under each --straggler-action: rebalance (the default: shares of
the global batch follow the rates), warn (an even split: the fleet at its slowest host's pace)
and leave (the slow host left behind when the goodput model says so, under HOST_DISCOVERY); and
the two other hosts alone with the same global batch, what leaving the slow one gives. The
configurations alternate, round after round, so that the machine's drift falls on all alike.
Prints, per round, each one's images/s over the second half of the run (the mean of its
progress windows there, as the progress lines count them) and its wall time, and the ratios to
the even fleet. ResNet-20 on synthetic data, a global batch of 192 (3 ranks x 16 x 4).

  bench/uneven_fleet.py SPOTRAIN_BINARY [ROUNDS] [STEPS]      (as root; about 4 min a round)

ONLY=NAME,NAME... runs those configurations alone (each named by its first word: even, uneven,
two); the even fleet always runs, the ratios' base.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from netns_fleet import Fleet, records  # noqa: E402

TRAIN = ["--model", "resnet20", "--data", "synthetic", "--batch-size", "16", "--accum-steps", "4",
         "--log-every", "5", "--threads", "1", "--eval-every", "0", "--ckpt-every", "0"]
CONFIGS = [  # name, the third host's share of a core (None: not in the job), extra arguments, discovery
    ("even fleet", 0.4, [], False),
    ("uneven, rebalance", 0.2, [], False),
    ("uneven, even split (warn)", 0.2, ["--straggler-action", "warn"], False),
    ("uneven, leave", 0.2, ["--straggler-action", "leave", "--straggler-windows", "2"], True),
    # What leaving the slow host gives: the two others with the same global batch (2 x 16 x 6).
    ("two hosts, the slow one left", None, ["--accum-steps", "6"], False),
]


def settings(base, extra):
    """base's flags with those of extra given in its place (flag value pairs)."""
    out = list(base)
    for i in range(0, len(extra), 2):
        if extra[i] in out:
            out[out.index(extra[i]) + 1] = extra[i + 1]
        else:
            out += extra[i:i + 2]
    return out


def second_half(run, steps):
    v = [r["images_per_sec"] for r in records(run)
         if r.get("type") == "step" and not r.get("superseded") and r["step"] > steps // 2]
    return sum(v) / len(v) if v else float("nan")


def main():
    spotrain = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 80
    work = tempfile.mkdtemp(prefix="uneven-fleet.")
    fleet = Fleet("unevenb", 3, work, spotrain)
    rows = []
    try:
        only = [w for w in os.environ.get("ONLY", "").split(",") if w]
        configs = [c for c in CONFIGS if not only or c[0] == "even fleet" or c[0].split()[0].strip(",") in only]
        for rnd in range(1, rounds + 1):
            for name, share, extra, discovery in configs:
                fleet.quota(1, 0.4)
                fleet.quota(2, 0.4)
                fleet.quota(3, share or 0.4)
                run = os.path.join(work, "r%d-%s" % (rnd, name.split()[0] + str(len(rows))))
                rc, out, secs = fleet.launch(settings(TRAIN, ["--steps", str(steps), "--ckpt-dir", run] + extra),
                                             hosts=(1, 2, 3) if share else (1, 2), discovery=discovery)
                ips = second_half(run, steps)
                shares = [r["micro_batches"] for r in records(run) if r.get("type") == "shares"]
                left = "left a host" if "leaving host" in out else ""
                rows.append((rnd, name, rc, ips, secs, shares[-1] if shares else None, left))
                print("round %d  %-28s exit %d  %7.1f images/s (steps %d-%d)  %5.1f s  shares %s %s" %
                      (rnd, name, rc, ips, steps // 2 + 1, steps, secs, shares[-1] if shares else "even", left),
                      flush=True)
        print("\n| round | fleet | images/s, 2nd half | x even fleet | wall s | shares at the end |")
        print("|---|---|---|---|---|---|")
        for rnd in range(1, rounds + 1):
            base = next(r[3] for r in rows if r[0] == rnd and r[1] == "even fleet")
            for r in rows:
                if r[0] == rnd:
                    print("| %d | %s | %.1f | %.2f | %.1f | %s%s |" % (rnd, r[1], r[3], r[3] / base, r[4],
                                                                     r[5] if r[5] else "even",
                                                                     " (" + r[6] + ")" if r[6] else ""))
    finally:
        fleet.down()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
