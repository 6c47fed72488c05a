#!/usr/bin/env python3
"""A spot market, scaled down in time, for a real training job.

Runs `spotrain train` on several hosts made as network namespaces (tests/netns_hosts.sh; needs
root and iproute2) through examples/resnet50/launch/mpirun.sh and its restart loop, and
preempts the hosts at random while the job trains: each host fails as a Poisson process with
mean time between failures --mtbf, a reclaim gives notice (SIGTERM to the host's ranks, as a
pod's SIGTERM reaches them through worker.sh) and, if the ranks have not left within --grace,
powers the host off (every process on it killed, its link cut: no reset sent) and brings it
back --replace seconds later. Deterministic mode throughout, so the interrupted job must end
on the same weights as an uninterrupted one (--reference checks, bit for bit, with h5diff).

Reported per run, from the run folder's metrics.jsonl (every step, resume and stop record has
its wall-clock time):
  goodput          time of the steps that survive to the end / wall time of the job
  lost per preemption   time of steps trained and then redone after a restart, per preemption
  restart -> first new step   from the previous attempt's last record to the first new step
  checkpoint overhead   training held for checkpoint state copies, as a share of wall time
as a table and one JSON line (--json FILE appends it there too).

  bench/spot_sim.py --mtbf 60 --steps 400 --ckpt-every 50 --reference
  bench/spot_sim.py --mtbf 60 --steps 400 --ckpt-every auto          (auto: --mtbf is passed on)
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS_SH = os.path.join(REPO, "tests", "netns_hosts.sh")
LAUNCHER = os.path.join(REPO, "examples", "resnet50", "launch", "mpirun.sh")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=2, help="hosts (one rank each)")
    p.add_argument("--mtbf", type=float, default=60, help="mean seconds between failures of one host")
    p.add_argument("--grace", type=float, default=5,
                   help="seconds from the notice to the hard kill (0: no notice, a hard kill at once)")
    p.add_argument("--replace", type=float, default=2, help="seconds until a powered-off host is back")
    p.add_argument("--keepalive", default="2 1 2",
                   help="mpirun.sh's OOB_KEEPALIVE: how soon a powered-off host is noticed (scaled down)")
    p.add_argument("--seed", type=int, default=1, help="seed of the preemption process")
    p.add_argument("--max-preemptions", type=int, default=1000, help="stop preempting after this many")
    p.add_argument("--model", default="resnet20")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--ckpt-every", default="50", help="steps, or auto (Young/Daly from --mtbf)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--train-args", default="", help="more spotrain train arguments")
    p.add_argument("--reference", action="store_true",
                   help="also run the job uninterrupted and compare the final weights bit for bit")
    p.add_argument("--spotrain", default=os.path.join(REPO, "build", "spotrain"))
    p.add_argument("--json", help="append the result's JSON line to this file")
    p.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    return p.parse_args()


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


class Hosts:
    def __init__(self, n):
        self.prefix = "sim%d" % (os.getpid() % 100000)
        out = subprocess.run([HOSTS_SH, "up", self.prefix, str(n)], capture_output=True, text=True)
        if out.returncode == 77:
            sys.exit("spot_sim: cannot make network namespaces here: " + out.stderr.strip())
        if out.returncode != 0:
            sys.exit("spot_sim: netns_hosts.sh up failed: " + out.stderr.strip())
        self.agent, self.net = out.stdout.split()[:2]
        self.n = n

    def pids(self, i, name=None):
        rows = [l.split(None, 1) for l in sh(HOSTS_SH, "pids", self.prefix, str(i)).splitlines()]
        # (a process that ended while listed has no name)
        return [int(r[0]) for r in rows if len(r) == 2 and (name is None or r[1].strip() == name)]

    def __call__(self, what, i):
        sh(HOSTS_SH, what, self.prefix, str(i))

    def down(self):
        subprocess.run([HOSTS_SH, "down", self.prefix], capture_output=True)


def launch(a, hosts, hostfile, run_dir, log_path, restarts):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               RANKS_PER_NODE="1", THREADS_PER_RANK=str(a.threads), SPOTRAIN=a.spotrain,
               MPI_IFNAME=hosts.net + ".0/24", MAX_RESTARTS=str(restarts),
               # the restart waits for a replaced host (a real cluster's scheduler does)
               RESTART_DELAY=str(int(a.replace) + 1), RESTART_DELAY_MAX=str(int(a.replace) + 1),
               OOB_KEEPALIVE=a.keepalive,
               MPIRUN_ARGS="--mca plm_rsh_agent %s --mca rtc ^hwloc --mca btl tcp,self" % hosts.agent)
    args = [LAUNCHER, hostfile, str(hosts.n), "--model", a.model, "--data", a.data,
            "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--deterministic",
            "--log-every", "1", "--test-limit", "64", "--comm-timeout", "20",
            "--ckpt-dir", run_dir, "--ckpt-every", a.ckpt_every] + a.train_args.split()
    if a.ckpt_every == "auto":
        args += ["--mtbf", "%gs" % a.mtbf]
    log = open(log_path, "w")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log


def count_steps_logged(log_path):
    """(steps logged by the current attempt, attempts restarted so far)"""
    with open(log_path, errors="replace") as f:
        text = f.read()
    attempts = text.split("mpirun.sh: restart ")
    return attempts[-1].count(" loss "), len(attempts) - 1


def preempt(a, hosts, job, log_path, events):
    """The spot market: while the job trains, hosts fail at rate hosts/mtbf."""
    rng = random.Random(a.seed)
    attempt_seen = -1
    while job.poll() is None and len(events) < a.max_preemptions:
        steps, attempt = count_steps_logged(log_path)
        if attempt == attempt_seen or steps == 0:  # wait for this attempt's training
            time.sleep(0.1)
            continue
        # The attempt trains: draw the next failure (memoryless, so per attempt is exact).
        attempt_seen = attempt
        fire_at = time.time() + rng.expovariate(hosts.n / a.mtbf)
        while time.time() < fire_at and job.poll() is None:
            time.sleep(0.05)
            if count_steps_logged(log_path)[1] != attempt:  # the job restarted by itself
                break
        if job.poll() is not None or count_steps_logged(log_path)[1] != attempt:
            continue
        host = rng.randrange(1, hosts.n + 1)
        ranks = hosts.pids(host, "spotrain")
        if not ranks:
            continue
        ev = {"at": time.time(), "host": host, "hard_kill": False}
        for pid in ranks if a.grace > 0 else []:  # the notice
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + a.grace
        while time.time() < deadline and hosts.pids(host, "spotrain"):
            time.sleep(0.05)
        if hosts.pids(host, "spotrain"):  # still there when the grace ends: reclaimed anyway
            ev["hard_kill"] = True
            killed = time.time()
            hosts("poweroff", host)
            # The replacement joins once the job has noticed the loss (the launcher's 76), and
            # --replace seconds after the kill at the earliest; the restart waits longer.
            while job.poll() is None and "the job ended with" not in open(log_path, errors="replace").read().split(
                    "mpirun.sh: restart ")[-1]:
                time.sleep(0.1)
            time.sleep(max(0.0, killed + a.replace - time.time()))
            hosts("restore", host)
        events.append(ev)


def iso(t):
    return datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def analyse(run_dir, wall):
    """Goodput and the rest from metrics.jsonl (see the module's docstring)."""
    records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    surviving, computed = {}, 0.0
    seg_prev, seg_first = None, True
    durations = []
    restarts, downtime, startup = 0, [], []
    last_time, prev_end, seg_start, waiting_first = None, None, None, False
    for r in records:
        t = iso(r["time"])
        if r["type"] == "start":  # a new process: the previous one's last record ended it
            prev_end = last_time
            if prev_end is not None:  # a restart (from a checkpoint, or from scratch before any)
                restarts += 1
                waiting_first = True
            seg_prev, seg_first, seg_start = r["elapsed"], True, t
        elif r["type"] == "resume":
            pass
        elif r["type"] == "step":
            d = r["elapsed"] - seg_prev
            seg_prev = r["elapsed"]
            if seg_first:  # includes the process's start-up: counted at the usual step time
                startup.append(t - seg_start)
                if waiting_first and prev_end is not None:
                    downtime.append(t - prev_end)
                waiting_first = False
                d = sorted(durations)[len(durations) // 2] if durations else d
                seg_first = False
            durations.append(d)
            computed += d
            surviving[r["step"]] = d
        last_time = t
    good = sum(surviving.values())
    lost = computed - good
    held = 0.0
    checkpoints = 0
    auto_interval = None
    with open(os.path.join(run_dir, "train.log"), errors="replace") as f:
        for line in f:
            m = re.search(r"training held ([0-9.]+) s", line)
            if m:
                held += float(m.group(1))
                checkpoints += 1
            m = re.search(r"checkpoint interval \(--ckpt-every auto\): ([0-9.]+) s", line)
            if m:
                auto_interval = float(m.group(1))
    return {"goodput": good / wall, "wall_s": wall, "step_time_s": good, "lost_s": lost,
            "restarts": restarts, "steps": len(surviving),
            "restart_to_first_step_s": sum(downtime) / len(downtime) if downtime else None,
            "startup_s": sum(startup[1:]) / len(startup[1:]) if len(startup) > 1 else None,
            "checkpoints": checkpoints, "checkpoint_held_s": held, "auto_interval_s": auto_interval,
            "checkpoint_overhead": held / wall}


def final_checkpoint(run_dir, steps):
    return os.path.join(run_dir, "ckpt-%08d.h5" % steps)


def same_weights(a_path, b_path):
    for group in ("/model", "/optimizer"):
        r = subprocess.run(["h5diff", "-q", a_path, b_path, group, group], capture_output=True)
        if r.returncode != 0:
            return False
    return True


def main():
    a = parse_args()
    if os.geteuid() != 0:
        sys.exit("spot_sim: needs root (network namespaces)")
    if not os.access(a.spotrain, os.X_OK):
        sys.exit("spot_sim: no spotrain binary at %s (build first, or --spotrain)" % a.spotrain)
    work = tempfile.mkdtemp(prefix="spot_sim.")
    hosts = Hosts(a.hosts)
    try:
        hostfile = os.path.join(work, "hosts")
        with open(hostfile, "w") as f:
            for i in range(1, a.hosts + 1):
                f.write("%s.%d slots=1\n" % (hosts.net, i))
        run_dir, log_path = os.path.join(work, "run"), os.path.join(work, "launch.log")
        print("spot_sim: %d hosts, MTBF %g s each, grace %g s, replace %g s; %s on %s, %d steps, "
              "--ckpt-every %s; log %s" % (a.hosts, a.mtbf, a.grace, a.replace, a.model, a.data,
                                           a.steps, a.ckpt_every, log_path), flush=True)
        events = []
        t0 = time.time()
        job, log = launch(a, hosts, hostfile, run_dir, log_path, restarts=1000)
        market = threading.Thread(target=preempt, args=(a, hosts, job, log_path, events), daemon=True)
        market.start()
        rc = job.wait()
        wall = time.time() - t0
        log.close()
        if rc != 0:
            sys.exit("spot_sim: the job failed (exit %d); see %s" % (rc, log_path))
        res = analyse(run_dir, wall)
        res.update({"hosts": a.hosts, "mtbf_s": a.mtbf, "grace_s": a.grace, "replace_s": a.replace,
                    "ckpt_every": a.ckpt_every, "model": a.model, "data": a.data,
                    "preemptions": len(events), "hard_kills": sum(e["hard_kill"] for e in events),
                    "seed": a.seed})
        res["lost_per_preemption_s"] = res["lost_s"] / len(events) if events else 0.0
        if a.reference:
            ref_dir = os.path.join(work, "ref")
            t1 = time.time()
            ref, ref_log = launch(a, hosts, hostfile, ref_dir, os.path.join(work, "ref.log"), restarts=0)
            if ref.wait() != 0:
                sys.exit("spot_sim: the reference run failed; see %s" % os.path.join(work, "ref.log"))
            ref_log.close()
            res["reference_wall_s"] = time.time() - t1
            res["reference_goodput"] = analyse(ref_dir, res["reference_wall_s"])["goodput"]
            res["bitwise_equal"] = same_weights(final_checkpoint(run_dir, a.steps),
                                                final_checkpoint(ref_dir, a.steps))
        rows = [("preemptions (hard kills)", "%d (%d)" % (res["preemptions"], res["hard_kills"])),
                ("restarts", res["restarts"]),
                ("wall time", "%.1f s" % wall),
                ("goodput", "%.3f" % res["goodput"]),
                ("lost per preemption", "%.2f s" % res["lost_per_preemption_s"]),
                ("restart -> first new step", "%.2f s" % res["restart_to_first_step_s"]
                 if res["restart_to_first_step_s"] is not None else "-"),
                ("checkpoints, training held", "%d, %.2f s (%.2f%% of wall time)" % (
                    res["checkpoints"], res["checkpoint_held_s"], 100 * res["checkpoint_overhead"]))]
        if a.reference:
            rows.append(("uninterrupted: wall time, goodput", "%.1f s, %.3f" % (
                res["reference_wall_s"], res["reference_goodput"])))
            rows.append(("final weights = uninterrupted run", "yes, bit for bit" if res["bitwise_equal"] else "NO"))
        for k, v in rows:
            print("  %-36s %s" % (k, v))
        line = json.dumps(res, sort_keys=True)
        print(line)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
        if a.keep:
            print("spot_sim: run folders kept in", work)
        return 0 if res.get("bitwise_equal", True) else 1
    finally:
        hosts.down()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
