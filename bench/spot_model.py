#!/usr/bin/env python3
"""Goodput and cost of data-parallel training on spot hosts, on paper (docs/SCALING.md).

Two uses:
  bench/spot_model.py --check SWEEP.jsonl   the model against bench/spot_sim.py's measurements:
                                            for each run, the goodput the model predicts from
                                            that run's own measured costs, beside the measured one
  bench/spot_model.py --fleet [options]     goodput and cost per epoch at 8, 64 and 512 hosts,
                                            for today's recovery and the survivors' (below)

The model. Hosts fail independently (exponential, mean --mtbf each), so the job fails with mean
M = MTBF / N. A checkpoint every T seconds of training costs C seconds; a failure costs the
restart R (noticing the loss, relaunching, loading, the first step) plus the work since the
last checkpoint. For exponential failures the expected wall time per T of work is
M e^(R/M) (e^((T+C)/M) - 1) (Daly 2006, eq. 20), so the failure part of goodput is
    g(T) = T / (M e^(R/M) (e^((T+C)/M) - 1)),
maximised near Young's T = sqrt(2 C M). Communication: a ring all-reduce of G gradient bytes
over N hosts moves 2 (N-1)/N G bytes per host at bandwidth B and takes 2 (N-1) latencies a;
backward hides it up to --overlap of the step, so the step grows by what is left.

With the survivors' recovery a hard reclaim loses only the step in flight (the survivors save
the last finished one), and the job goes on at once on the hosts that remain: a failure costs
R_s (notice, save, relaunch, first step) and half a step; the job then runs on N-1 hosts
(keeping its global batch: N/(N-1) the time per step) until the replacement is up D seconds
later, which costs D/N of full speed, and growing back onto it is a stop and a start, R_g. So
    g_s = M / (M + R_s + s/2 + D/N + R_g),
checkpoints on a timer no longer matter for reclaims (only for the whole job's loss).
"""
import argparse
import json
import math
import sys


def failure_goodput(T, C, R, M, fail_in_restart=True):
    """Share of wall time that is kept training for checkpoint interval T: Daly's, where hosts
    fail during restarts too; or, as bench/spot_sim.py preempts (only while the job trains),
    (M + R)(e^((T+C)/M) - 1) of wall time per T of work."""
    if fail_in_restart:
        return T / (M * math.exp(R / M) * (math.exp((T + C) / M) - 1.0))
    return T / ((M + R) * (math.exp((T + C) / M) - 1.0))


def young_daly(C, M):
    return math.sqrt(2.0 * C * M)


def survivors_goodput(M, R_s, step, D, n, R_g):
    """Share of wall time at full speed with the survivors' recovery (the module's docstring)."""
    return M / (M + R_s + step / 2.0 + D / max(n, 1) + R_g)


def check(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    failed = [r for r in rows if r.get("failed")]
    rows = [r for r in rows if not r.get("failed")]
    if failed:
        print("(%d run(s) whose job failed are left out: %s)" % (len(failed), ", ".join(
            "%s mtbf %g seed %d" % (r["recovery"], r["mtbf_s"], r["seed"]) for r in failed)))
    print("%-6s %-9s %9s %9s %9s %8s %8s %8s %s" % ("mtbf", "interval", "measured", "model", "ratio",
                                                   "T s", "R s", "M s", "recovery"))
    for r in rows:
        M = r["mtbf_s"] / r["hosts"]
        R = r["restart_to_first_step_s"] or 0.0
        # Seconds of training per checkpoint (fixed or auto alike), and the run's goodput were
        # nothing to fail: its steps over its wall time less what the failures took.
        T = r["step_time_s"] / max(r["checkpoints"], 1)
        base = r["step_time_s"] / max(r["wall_s"] - r["lost_s"] - r["restarts"] * R, 1e-9)
        C = r["checkpoint_held_s"] / max(r["checkpoints"], 1)
        if r.get("recovery") == "survivors":
            # Each failure: a restart on the hosts left, then one more (growing back); the
            # simulator's goodput counts the slower steps on fewer hosts as training.
            pred = min(base, 1.0) * M / (M + 2 * R)
        else:
            pred = min(base, 1.0) * failure_goodput(T, C, R, M, fail_in_restart=False)
        print("%-6g %-9s %9.3f %9.3f %9.2f %8.2f %8.2f %8.1f %s" % (
            r["mtbf_s"], r["ckpt_every"], r["goodput"], pred, r["goodput"] / pred, T, R, M,
            r.get("recovery", "today")))


def fleet(a):
    print("ResNet-50, %d images per epoch; per host: %g images/s, %g $/h, MTBF %g h; "
          "checkpoint cost %g s, restart %g s; all-reduce %g MB at %g GB/s, %g us per hop; "
          "backward hides %d%% of the step" % (a.images, a.host_ips, a.price, a.mtbf_h, a.ckpt_cost,
                                               a.restart, a.grad_mb, a.bw_gbs, a.latency_us,
                                               100 * a.overlap))
    print("survivors: restart on the hosts left %g s, growing back %g s, a replacement %g s later"
          % (a.survivor_restart, a.grow_restart, a.replacement))
    print("%6s %10s %9s %11s %10s %9s %12s %14s %11s %14s" % (
        "hosts", "job MTBF", "T_opt", "comm/step", "step eff", "goodput", "epoch (min)",
        "$ 90 epochs", "survivors", "$ 90 epochs"))
    step = a.batch / a.host_ips  # seconds per step on one host
    for n in a.hosts:
        M = a.mtbf_h * 3600.0 / n
        T = young_daly(a.ckpt_cost, M)
        ring = 2.0 * (n - 1) / n * a.grad_mb * 1e6 / (a.bw_gbs * 1e9) + 2 * (n - 1) * a.latency_us * 1e-6
        exposed = max(0.0, ring - a.overlap * step)
        eff = step / (step + exposed)
        g = eff * failure_goodput(T, a.ckpt_cost, a.restart, M)
        gs = eff * survivors_goodput(M, a.survivor_restart, step + exposed, a.replacement, n, a.grow_restart)
        hours = a.images / (n * a.host_ips * g) / 3600.0
        hours_s = a.images / (n * a.host_ips * gs) / 3600.0
        print("%6d %9.2fh %8.0fs %10.1f%% %10.3f %9.3f %12.2f %14.2f %11.3f %14.2f" % (
            n, M / 3600.0, T, 100 * exposed / step if n > 1 else 0.0, eff, g, 60 * hours,
            90 * hours * n * a.price, gs, 90 * hours_s * n * a.price))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", metavar="SWEEP.jsonl")
    p.add_argument("--fleet", action="store_true")
    p.add_argument("--hosts", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--host-ips", type=float, default=8 * 6386.0,
                   help="images/s of one host (default: 8 H200 at spotrain's measured bf16 6,386)")
    p.add_argument("--batch", type=float, default=8 * 256, help="images per step on one host")
    p.add_argument("--price", type=float, default=20.0, help="$ per host-hour (spot)")
    p.add_argument("--mtbf-h", type=float, default=24.0, help="hours between reclaims of one host")
    p.add_argument("--ckpt-cost", type=float, default=0.05, help="seconds a checkpoint costs training")
    p.add_argument("--restart", type=float, default=120.0, help="seconds from a loss to training again")
    p.add_argument("--survivor-restart", type=float, default=31.0,
                   help="survivors: seconds from a hard reclaim to training on the hosts left "
                        "(11 to notice, 1 to save, 10 of Open MPI's kill at SURVIVOR_WAIT 5, 9 to start)")
    p.add_argument("--grow-restart", type=float, default=10.0,
                   help="survivors: seconds growing back onto a replacement costs (a stop and a start)")
    p.add_argument("--replacement", type=float, default=120.0,
                   help="survivors: seconds until a replacement host is up")
    p.add_argument("--grad-mb", type=float, default=51.0, help="gradient MB all-reduced per step (fp16)")
    p.add_argument("--bw-gbs", type=float, default=50.0, help="GB/s between hosts (400 Gb/s)")
    p.add_argument("--latency-us", type=float, default=10.0)
    p.add_argument("--overlap", type=float, default=0.6, help="share of the step backward can hide")
    p.add_argument("--images", type=float, default=1281167, help="images per epoch (ImageNet-1k)")
    a = p.parse_args()
    if a.check:
        check(a.check)
    if a.fleet:
        fleet(a)
    if not a.check and not a.fleet:
        p.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
