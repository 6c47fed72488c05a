#!/usr/bin/env python3
"""Goodput and cost of data-parallel training on spot hosts, on paper (docs/SCALING.md).

Two uses:
  bench/spot_model.py --check SWEEP.jsonl   the model against bench/spot_sim.py's measurements:
                                            for each run, the goodput the model predicts from
                                            that run's own measured costs, beside the measured one
  bench/spot_model.py --fleet [options]     goodput and cost per epoch at 8, 64 and 512 hosts

The model. Hosts fail independently (exponential, mean --mtbf each), so the job fails with mean
M = MTBF / N. A checkpoint every T seconds of training costs C seconds; a failure costs the
restart R (noticing the loss, relaunching, loading, the first step) plus the work since the
last checkpoint. For exponential failures the expected wall time per T of work is
M e^(R/M) (e^((T+C)/M) - 1) (Daly 2006, eq. 20), so the failure part of goodput is
    g(T) = T / (M e^(R/M) (e^((T+C)/M) - 1)),
maximised near Young's T = sqrt(2 C M). Communication: a ring all-reduce of G gradient bytes
over N hosts moves 2 (N-1)/N G bytes per host at bandwidth B and takes 2 (N-1) latencies a;
backward hides it up to --overlap of the step, so the step grows by what is left.
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


def check(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    print("%-6s %-9s %9s %9s %9s %8s %8s %8s" % ("mtbf", "interval", "measured", "model", "ratio",
                                                "T s", "R s", "M s"))
    for r in rows:
        M = r["mtbf_s"] / r["hosts"]
        R = r["restart_to_first_step_s"] or 0.0
        # Seconds of training per checkpoint (fixed or auto alike), and the run's goodput were
        # nothing to fail: its steps over its wall time less what the failures took.
        T = r["step_time_s"] / max(r["checkpoints"], 1)
        base = r["step_time_s"] / max(r["wall_s"] - r["lost_s"] - r["restarts"] * R, 1e-9)
        C = r["checkpoint_held_s"] / max(r["checkpoints"], 1)
        pred = min(base, 1.0) * failure_goodput(T, C, R, M, fail_in_restart=False)
        print("%-6g %-9s %9.3f %9.3f %9.2f %8.2f %8.2f %8.1f" % (
            r["mtbf_s"], r["ckpt_every"], r["goodput"], pred, r["goodput"] / pred, T, R, M))


def fleet(a):
    print("ResNet-50, %d images per epoch; per host: %g images/s, %g $/h, MTBF %g h; "
          "checkpoint cost %g s, restart %g s; all-reduce %g MB at %g GB/s, %g us per hop; "
          "backward hides %d%% of the step" % (a.images, a.host_ips, a.price, a.mtbf_h, a.ckpt_cost,
                                               a.restart, a.grad_mb, a.bw_gbs, a.latency_us,
                                               100 * a.overlap))
    print("%6s %10s %9s %11s %10s %9s %12s %14s %14s" % (
        "hosts", "job MTBF", "T_opt", "comm/step", "step eff", "goodput", "epoch (min)",
        "$ per epoch", "$ 90 epochs"))
    step = a.batch / a.host_ips  # seconds per step on one host
    for n in a.hosts:
        M = a.mtbf_h * 3600.0 / n
        T = young_daly(a.ckpt_cost, M)
        ring = 2.0 * (n - 1) / n * a.grad_mb * 1e6 / (a.bw_gbs * 1e9) + 2 * (n - 1) * a.latency_us * 1e-6
        exposed = max(0.0, ring - a.overlap * step)
        eff = step / (step + exposed)
        g = eff * failure_goodput(T, a.ckpt_cost, a.restart, M)
        hours = a.images / (n * a.host_ips * g) / 3600.0
        print("%6d %9.2fh %8.0fs %10.1f%% %10.3f %9.3f %12.2f %14.2f %14.2f" % (
            n, M / 3600.0, T, 100 * exposed / step if n > 1 else 0.0, eff, g, 60 * hours,
            hours * n * a.price, 90 * hours * n * a.price))


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
