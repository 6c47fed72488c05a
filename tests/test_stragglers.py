#!/usr/bin/env python3
"""Stragglers on three namespace hosts (tests/netns_hosts.sh), one rank each, launched by
examples/resnet50/launch/mpirun.sh as a multi-node job is. A rank is made slow by stopping and
continuing its process on a duty cycle (a host that gets a quarter of the CPU time, or 0.9 of it):

- warn: the rank at a quarter speed is named, with its host, within two progress windows, and
  the job trains on to its end; even runs of the same length name no one (three of them); both
  with --straggler-action warn (the default, rebalance, would move the slow rank's share:
  tests/test_rebalance.py);
- leave (HOST_DISCOVERY): the rank at a quarter speed is left behind at an agreed step with a
  checkpoint, the job restarts at once on the two other hosts with the same global batch (each
  rank now taking 3 micro-batches of 16 where it took 2) and ends bit for bit as a two-host run
  from that checkpoint does. With --deterministic, whose shares stay even: moving the slow
  rank's share first (the default) can make the step short enough that leaving no longer pays,
  and which way that goes depends on how fast this machine is (tests/test_rebalance.py weighs
  leaving after shares moved);
- a rank 0.9 as fast (1.1x slower) is weighed and stays: the model says leaving would not pay.

Steps are counted, not seconds: the duty cycle slows the rank by its share of time whatever the
machine's speed, and its period (40 ms) is short against a progress window of 10 steps (0.5-1 s
here; a machine several times faster still sees several periods a window). The thresholds are set above this machine's noise (three ranks share two cores
here: +-30% between ranks in a window); a fleet of its own hosts keeps the default 1.2.
Exit 77 (skipped) where network namespaces cannot be made.

  tests/test_stragglers.py SPOTRAIN_BINARY
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from netns_fleet import HOSTS, records, same_weights, start_fleet_test

PREFIX = "strag"
TRAIN = ["--model", "resnet20", "--data", "synthetic", "--batch-size", "16", "--log-every", "10",
         "--threads", "1", "--eval-every", "0", "--straggler-threshold", "1.5"]


class DutyCycle:
    """Stops and continues the spotrain process on host `host` for `stop` of every `period`
    seconds, from when it appears until it is gone (each process of the host in turn)."""

    def __init__(self, host, stop, period):
        self.host, self.stop, self.period = host, stop, period
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def pid(self):
        out = subprocess.run([HOSTS, "pids", PREFIX, str(self.host)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pid, _, name = line.partition(" ")
            if name.strip() == "spotrain":
                return int(pid)
        return None

    def run(self):
        while not self.done.is_set():
            pid = self.pid()
            if pid is None:
                time.sleep(0.05)
                continue
            try:
                while not self.done.is_set():
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(self.period * self.stop)
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(self.period * (1 - self.stop))
            except ProcessLookupError:
                pass

    def end(self):
        self.done.set()
        self.thread.join()
        pid = self.pid()
        if pid:
            os.kill(pid, signal.SIGCONT)


def main():
    global SPOTRAIN
    SPOTRAIN = sys.argv[1]
    if shutil.which("h5diff") is None:
        print("skipped: no h5diff (Debian: hdf5-tools)")
        return 77
    started = start_fleet_test("stragglers", PREFIX, 3, SPOTRAIN, "network namespaces")
    if started is None:
        return 77
    work, check, fleet = started
    try:
        slow_host = "%s.3" % fleet.net
        # 1. warn: the quarter-speed rank named within two windows, the job trains on.
        run = os.path.join(work, "warn")
        duty = DutyCycle(3, 0.75, 0.04)
        rc, out, secs = fleet.launch(TRAIN + ["--steps", "40", "--straggler-action", "warn", "--ckpt-dir", run])
        duty.end()
        print(out[-3000:])
        check(rc == 0, "warn: the job with a slow rank ran to its end (exit %d, %.0f s)" % (rc, secs))
        named = [r for r in records(run) if r.get("type") == "warning" and r.get("kind") == "straggler"]
        first = min([r["step"] for r in named if r.get("host") == slow_host], default=None)
        check(first is not None and first <= 20,
              "warn: rank 2 on %s named by step 20 (first named at step %s)" % (slow_host, first))
        check(all(r.get("host") == slow_host for r in named),
              "warn: no other host named (%s)" % sorted({r.get("host") for r in named}))
        check(re.search(r"straggler: rank 2 on %s: compute [0-9.]+ s/step, [0-9.]+x the median" %
                        re.escape(slow_host), out) is not None, "warn: the log line names rank and host")
        steps = [r for r in records(run) if r.get("type") == "step" and "ranks" in r]
        check(len(steps) > 0 and all(len(r["ranks"]) == 3 for r in steps),
              "warn: every progress record holds the three ranks' times")

        # 2. Even runs of the same length name no one.
        for i in range(3):
            run = os.path.join(work, "even%d" % i)
            rc, out, _ = fleet.launch(TRAIN + ["--steps", "40", "--straggler-action", "warn", "--ckpt-dir", run])
            check(rc == 0 and "straggler:" not in out, "even run %d names no one (exit %d)" % (i + 1, rc))

        # 3. leave: the quarter-speed host left behind, the job ends on two hosts bit for bit
        # as a two-host run from the checkpoint it stopped at.
        run = os.path.join(work, "leave")
        args = TRAIN + ["--steps", "100", "--accum-steps", "2", "--keep", "20", "--deterministic",
                        "--straggler-action", "leave", "--straggler-windows", "2", "--ckpt-dir", run]
        duty = DutyCycle(3, 0.75, 0.04)
        rc, out, secs = fleet.launch(args, discovery=True)
        duty.end()
        print(out[-4000:])
        check(rc == 0, "leave: the job finished (exit %d, %.0f s)" % (rc, secs))
        m = re.search(r"straggler: leaving host (\S+) behind .*", out)
        check(m is not None and m.group(1) == slow_host, "leave: host %s left behind: %s" %
              (slow_host, m.group(0) if m else "no such line"))
        check("left out for 3600 s" in out, "leave: the launcher left the host out (LEAVE_FOR)")
        stop = re.search(r"stopped by leaving straggler host \S+ after step (\d+)", out)
        check(stop is not None, "leave: the job stopped with a checkpoint to leave it")
        resumes = [r for r in records(run) if r.get("type") == "start"]
        check(len(resumes) == 2 and resumes[-1].get("ranks") == 2,
              "leave: a second start on 2 ranks (%s)" % [r.get("ranks") for r in resumes])
        check("2 ranks x 16 x 3 micro-batches" in out or "x 3 micro-batches per step" in out,
              "leave: the two ranks keep the global batch of 96 with 3 micro-batches each")
        if stop:
            at = int(stop.group(1))
            ckpt = os.path.join(run, "ckpt-%08d.h5" % at)
            final = os.path.join(run, "ckpt-%08d.h5" % 100)
            ref_run = os.path.join(work, "two-host")
            ref_args = list(args)
            ref_args[ref_args.index("--straggler-action") + 1] = "warn"
            ref_args[ref_args.index("--ckpt-dir") + 1] = ref_run
            rc2, out2, _ = fleet.launch(ref_args + ["--resume", ckpt], hosts=(1, 2))
            check(rc2 == 0, "leave: the two-host run from step %d finished (exit %d)" % (at, rc2))
            ref_final = os.path.join(ref_run, "ckpt-%08d.h5" % 100)
            check(os.path.exists(final) and os.path.exists(ref_final) and same_weights(final, ref_final),
                  "leave: the final weights and optimizer equal the two-host run's bit for bit")

        # 4. A rank 1.1x slower is weighed, named at a low threshold, and stays.
        run = os.path.join(work, "stay")
        args = [a for a in TRAIN]
        args[args.index("--straggler-threshold") + 1] = "1.05"
        duty = DutyCycle(3, 0.09, 0.04)
        rc, out, _ = fleet.launch(args + ["--steps", "60", "--accum-steps", "2", "--straggler-action", "leave",
                                          "--straggler-windows", "1", "--ckpt-dir", run], discovery=True)
        duty.end()
        stays = re.findall(r"straggler: host (\S+) stays \(.*", out)
        print("\n".join(l for l in out.splitlines() if "straggler" in l))
        check(rc == 0 and "leaving host" not in out and "stopped by" not in out,
              "stay: the job with a 1.1x slower rank ran to its end on three hosts (exit %d)" % rc)
        check(len(stays) > 0, "stay: a straggling host was weighed and stays (%s)" % stays)
    finally:
        fleet.down()
    return check.finish(work)


if __name__ == "__main__":
    sys.exit(main())
