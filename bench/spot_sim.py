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

Two ways to recover (--recovery): `today` is the shared run folder, restarts that wait for the
replacement host, and survivors that save nothing (--lost-peer-save 0); `survivors` gives each
host a disk of its own (node-local: a replaced host comes back with an empty one), the
survivors of a hard kill save the last step every rank finished, the launcher restarts at once
on the hosts that remain (HOST_DISCOVERY) and grows the job back when the replacement is up.

Reported per run, from the job's metrics.jsonl (rank 0's, --metrics on shared storage: every
step, resume, stop and lost-peer record has its wall-clock time):
  goodput          time of the steps that survive to the end / wall time of the job
  work goodput     the steps that survive, each at the full-size job's median step time, / wall
                   time (a shrunk job's slower steps count as the work they do, not their time)
  lost per preemption   steps (and their time) trained and then redone after a restart
  kill -> first new step   per hard kill: detection (kill -> the survivors' save begins), the
                   save, restart (the save -> the new process's start record), first step
  checkpoint overhead   training held for checkpoint state copies, as a share of wall time
  speed vs uninterrupted   (--reference) the uninterrupted run's wall time / this run's
as a table and one JSON line (--json FILE appends it there too).

  bench/spot_sim.py --mtbf 60 --steps 400 --ckpt-every 50 --reference
  bench/spot_sim.py --mtbf 60 --steps 400 --ckpt-every auto          (auto: --mtbf is passed on)
  bench/spot_sim.py --recovery survivors --grace 0 --mtbf 60 --replace 20 --ckpt-every auto

--mtbf-steps runs the failure clock on the job's training steps instead of seconds: a test's
preemptions then land at the same steps on a fast machine and a slow one (in seconds, a fast
machine can finish the job before a drawn failure). What is measured stays in seconds; mtbf_s
is then the step MTBF at the full-size job's median step time.
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
    p.add_argument("--mtbf-steps", type=float,
                   help="instead of --mtbf: mean training steps between failures of one host (steps "
                        "the job's current attempt has logged), so the failures do not depend on the "
                        "machine's speed")
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
    p.add_argument("--recovery", choices=("today", "survivors"), default="today",
                   help="today: shared folder, restarts wait for the replacement, no survivor save; "
                        "survivors: node-local disks, survivors save, restart on the hosts left, grow back")
    p.add_argument("--survivor-wait", type=int, default=3,
                   help="mpirun.sh's SURVIVOR_WAIT (scaled down): Open MPI's SIGCONT-SIGTERM-SIGKILL spacing")
    return p.parse_args()


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


class Hosts:
    def __init__(self, n, disk=None):
        self.prefix = "sim%d" % (os.getpid() % 100000)
        self.disk = disk  # each host's own disk is mounted here (node-local), or None
        out = subprocess.run([HOSTS_SH, "up", self.prefix, str(n)] + ([disk] if disk else []),
                             capture_output=True, text=True)
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

    def disk_of(self, i):  # where host i's disk lies, seen from here
        return "/tmp/%s-netns/disk-%d" % (self.prefix, i)

    def down(self):
        subprocess.run([HOSTS_SH, "down", self.prefix], capture_output=True)


def launch(a, hosts, hostfile, run_dir, metrics, log_path, restarts):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               RANKS_PER_NODE="1", THREADS_PER_RANK=str(a.threads), SPOTRAIN=a.spotrain,
               MPI_IFNAME=hosts.net + ".0/24", MAX_RESTARTS=str(restarts),
               # the restart waits for a replaced host (a real cluster's scheduler does)
               RESTART_DELAY=str(int(a.replace) + 1), RESTART_DELAY_MAX=str(int(a.replace) + 1),
               OOB_KEEPALIVE=a.keepalive,
               # today: Open MPI's own kill spacing (1 s), as the launcher had before survivors saved
               SURVIVOR_WAIT=str(a.survivor_wait if a.recovery == "survivors" else 1),
               MPIRUN_ARGS="--mca plm_rsh_agent %s --mca rtc ^hwloc --mca btl tcp,self" % hosts.agent)
    if a.recovery == "survivors":  # restart on the hosts up, grow back when one returns
        env.update(HOST_DISCOVERY="%s hosts %s" % (HOSTS_SH, hosts.prefix), MIN_HOSTS="1",
                   DISCOVERY_INTERVAL="1")
        hostfile = "-"
    args = [LAUNCHER, hostfile, str(hosts.n), "--model", a.model, "--data", a.data,
            "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--deterministic",
            "--log-every", "1", "--test-limit", "64", "--comm-timeout", "20",
            "--ckpt-dir", run_dir, "--ckpt-every", a.ckpt_every, "--metrics", metrics,
            "--lost-peer-save", "0" if a.recovery == "today" else "30"] + a.train_args.split()
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
    """The spot market: while the job trains, hosts fail at rate hosts/mtbf (per second, or per
    step logged with --mtbf-steps)."""
    rng = random.Random(a.seed)
    attempt_seen = -1
    while job.poll() is None and len(events) < a.max_preemptions:
        steps, attempt = count_steps_logged(log_path)
        if attempt == attempt_seen or steps == 0:  # wait for this attempt's training
            time.sleep(0.1)
            continue
        # The attempt trains: draw the next failure (memoryless, so per attempt is exact).
        attempt_seen = attempt
        if a.mtbf_steps:  # due once the attempt has logged that many more steps
            fire_at = steps + rng.expovariate(hosts.n / a.mtbf_steps)
            now, poll = (lambda: count_steps_logged(log_path)[0]), 0.01  # a step can be short
        else:
            fire_at = time.time() + rng.expovariate(hosts.n / a.mtbf)
            now, poll = time.time, 0.05
        while now() < fire_at and job.poll() is None:
            time.sleep(poll)
            if count_steps_logged(log_path)[1] != attempt:  # the job restarted by itself
                break
        if job.poll() is not None or count_steps_logged(log_path)[1] != attempt:
            continue
        host = rng.randrange(1, hosts.n + 1)
        ranks = hosts.pids(host, "spotrain")
        if not ranks:
            continue
        ev = {"at": time.time(), "host": host, "hard_kill": False, "killed": None}
        for pid in ranks if a.grace > 0 else []:  # the notice
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + a.grace
        while time.time() < deadline and hosts.pids(host, "spotrain"):
            time.sleep(0.05)
        events.append(ev)
        if hosts.pids(host, "spotrain"):  # still there when the grace ends: reclaimed anyway
            ev["hard_kill"] = True
            killed = time.time()
            ev["killed"] = killed
            hosts("poweroff", host)
            # The replacement joins once the job has noticed the loss (the launcher's 76, or its
            # restart on the hosts that remain), and --replace seconds after the kill at the
            # earliest; the restart waits longer where it waits for the replacement.
            while job.poll() is None and count_steps_logged(log_path)[1] == attempt and \
                    "the job ended with" not in open(log_path, errors="replace").read().split(
                        "mpirun.sh: restart ")[-1]:
                time.sleep(0.1)
            time.sleep(max(0.0, killed + a.replace - time.time()))
            if job.poll() is not None:  # the job ended before the replacement came
                break
            if hosts.disk:  # a new instance: a new, empty disk
                hosts("wipe", host)
            hosts("restore", host)
            ev["restored"] = time.time()


def iso(t):
    return datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def analyse(metrics, launch_log, wall, events=()):
    """Goodput and the rest from metrics.jsonl (see the module's docstring)."""
    records = [json.loads(l) for l in open(metrics) if l.strip()]
    surviving, computed, redone = {}, 0.0, 0
    seg_prev, seg_first = None, True
    durations = []
    ranks, full_ranks, full_durations = 0, 0, []  # the job's size now, its largest, steps at it
    restarts, downtime, startup = 0, [], []
    last_time, prev_end, seg_start, waiting_first = None, None, None, False
    for r in records:
        t = iso(r["time"])
        if r["type"] == "start":  # a new process: the previous one's last record ended it
            ranks = r.get("ranks", 1)
            full_ranks = max(full_ranks, ranks)
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
            if ranks == full_ranks:
                full_durations.append(d)
            computed += d
            redone += r["step"] in surviving
            surviving[r["step"]] = d
        last_time = t
    good = sum(surviving.values())
    lost = computed - good
    # Work: each surviving step at the job's full-size step time. A job that shrank keeps its
    # global batch, so its steps take longer on fewer hosts; goodput counts that time, work
    # does not (the same steps on all hosts would have been done sooner).
    full_step = sorted(full_durations)[len(full_durations) // 2] if full_durations else 0.0
    held = 0.0
    checkpoints = 0
    auto_interval = None
    with open(launch_log, errors="replace") as f:
        for line in f:
            m = re.search(r"training held ([0-9.]+) s", line)
            if m:
                held += float(m.group(1))
                checkpoints += 1
            m = re.search(r"checkpoint interval \(--ckpt-every auto\): ([0-9.]+) s", line)
            if m:
                auto_interval = float(m.group(1))
    phases = kill_phases(records, events)
    return {"goodput": good / wall, "work_goodput": len(surviving) * full_step / wall,
            "full_step_s": full_step, "wall_s": wall, "step_time_s": good, "lost_s": lost,
            "redone_steps": redone, "phases": phases,
            "restarts": restarts, "steps": len(surviving),
            "restart_to_first_step_s": sum(downtime) / len(downtime) if downtime else None,
            "startup_s": sum(startup[1:]) / len(startup[1:]) if len(startup) > 1 else None,
            "checkpoints": checkpoints, "checkpoint_held_s": held, "auto_interval_s": auto_interval,
            "checkpoint_overhead": held / wall}


def kill_phases(records, events):
    """Per hard kill: kill -> detection (the survivors' save begins), the save, -> the new
    process's start record (restart), -> its first step. None where a record is missing."""
    out = []
    for ev in events:
        k = ev.get("killed")
        if k is None:
            continue
        after = [(iso(r["time"]), r) for r in records if iso(r["time"]) > k]
        start = next(((t, r) for t, r in after if r["type"] == "start"), None)
        # the survivors' record of this loss: before the next process starts
        lp = next(((t, r) for t, r in after if r["type"] == "lost_peer" and (not start or t < start[0])), None)
        first = next(((t, r) for t, r in after if r["type"] == "step" and start and t > start[0]), None)
        save_end = lp[0] if lp else None
        save_s = lp[1].get("save_seconds") if lp else None
        row = {"detect_s": save_end - save_s - k if lp else None, "save_s": save_s,
               "restart_s": start[0] - (save_end if lp else k) if start else None,
               "first_step_s": first[0] - start[0] if first and start else None,
               "saved": bool(lp and lp[1].get("saved"))}
        row["kill_to_first_step_s"] = first[0] - k if first else None
        out.append(row)
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


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
    if a.mtbf_steps is not None and (a.mtbf_steps <= 0 or a.ckpt_every == "auto"):
        sys.exit("spot_sim: --mtbf-steps must be positive, and --ckpt-every auto needs --mtbf (seconds)")
    if not os.access(a.spotrain, os.X_OK):
        sys.exit("spot_sim: no spotrain binary at %s (build first, or --spotrain)" % a.spotrain)
    work = tempfile.mkdtemp(prefix="spot_sim.")
    # survivors: each host's own disk at one path (the run folder inside it)
    hosts = Hosts(a.hosts, os.path.join(work, "disk") if a.recovery == "survivors" else None)
    try:
        hostfile = os.path.join(work, "hosts")
        with open(hostfile, "w") as f:
            for i in range(1, a.hosts + 1):
                f.write("%s.%d slots=1\n" % (hosts.net, i))
        base = hosts.disk or work
        run_dir, log_path = os.path.join(base, "run"), os.path.join(work, "launch.log")
        metrics = os.path.join(work, "metrics.jsonl")
        print("spot_sim: %d hosts, MTBF %s each, grace %g s, replace %g s; %s on %s, %d steps, "
              "--ckpt-every %s, recovery %s; log %s" % (a.hosts, "%g steps" % a.mtbf_steps if a.mtbf_steps
                                                        else "%g s" % a.mtbf, a.grace, a.replace, a.model,
                                                        a.data, a.steps, a.ckpt_every, a.recovery,
                                                        log_path), flush=True)
        events = []
        t0 = time.time()
        job, log = launch(a, hosts, hostfile, run_dir, metrics, log_path, restarts=1000)
        market = threading.Thread(target=preempt, args=(a, hosts, job, log_path, events), daemon=True)
        market.start()
        rc = job.wait()
        wall = time.time() - t0
        log.close()
        if rc != 0:
            a.keep = True  # the log it names must still be there
            sys.exit("spot_sim: the job failed (exit %d); see %s" % (rc, log_path))
        res = analyse(metrics, log_path, wall, events)
        # (--mtbf-steps: in seconds at the full-size step time, as plan --check-sweep reads it)
        mtbf_s = a.mtbf_steps * res["full_step_s"] if a.mtbf_steps else a.mtbf
        res.update({"hosts": a.hosts, "mtbf_s": mtbf_s, "mtbf_steps": a.mtbf_steps, "grace_s": a.grace,
                    "replace_s": a.replace, "ckpt_every": a.ckpt_every, "model": a.model, "data": a.data,
                    "preemptions": len(events), "hard_kills": sum(e["hard_kill"] for e in events),
                    "seed": a.seed, "recovery": a.recovery})
        res["lost_per_preemption_s"] = res["lost_s"] / len(events) if events else 0.0
        res["lost_steps_per_preemption"] = res["redone_steps"] / len(events) if events else 0.0
        for k in ("detect_s", "save_s", "restart_s", "first_step_s", "kill_to_first_step_s"):
            res[k] = mean(p[k] for p in res["phases"])
        # The final checkpoint: in the run folder, or on any host's disk that holds it.
        final = final_checkpoint(run_dir, a.steps)
        if hosts.disk:
            held = [final_checkpoint(os.path.join(hosts.disk_of(i), "run"), a.steps) for i in range(1, a.hosts + 1)]
            final = next((f for f in held if os.path.exists(f)), final)
        if a.reference:
            ref_dir = os.path.join(base, "ref")
            ref_metrics = os.path.join(work, "ref-metrics.jsonl")
            t1 = time.time()
            ref, ref_log = launch(a, hosts, hostfile, ref_dir, ref_metrics, os.path.join(work, "ref.log"), restarts=0)
            if ref.wait() != 0:
                a.keep = True
                sys.exit("spot_sim: the reference run failed; see %s" % os.path.join(work, "ref.log"))
            ref_log.close()
            res["reference_wall_s"] = time.time() - t1
            res["reference_goodput"] = analyse(ref_metrics, os.path.join(work, "ref.log"), res["reference_wall_s"])["goodput"]
            res["speed_vs_uninterrupted"] = res["reference_wall_s"] / wall
            ref_final = final_checkpoint(ref_dir, a.steps)
            if hosts.disk:
                ref_final = final_checkpoint(os.path.join(hosts.disk_of(1), "ref"), a.steps)
            res["bitwise_equal"] = same_weights(final, ref_final)
        rows = [("preemptions (hard kills)", "%d (%d)" % (res["preemptions"], res["hard_kills"])),
                ("restarts", res["restarts"]),
                ("wall time", "%.1f s" % wall),
                ("goodput", "%.3f" % res["goodput"]),
                ("work goodput (steps at full size)", "%.3f" % res["work_goodput"]),
                ("lost per preemption", "%.2f steps, %.2f s" % (res["lost_steps_per_preemption"],
                                                                res["lost_per_preemption_s"])),
                ("restart -> first new step", "%.2f s" % res["restart_to_first_step_s"]
                 if res["restart_to_first_step_s"] is not None else "-"),
                ("hard kill -> first new step", "%s (detect %s, save %s, restart %s, first step %s)" % tuple(
                    "%.2f s" % res[k] if res[k] is not None else "-"
                    for k in ("kill_to_first_step_s", "detect_s", "save_s", "restart_s", "first_step_s"))),
                ("checkpoints, training held", "%d, %.2f s (%.2f%% of wall time)" % (
                    res["checkpoints"], res["checkpoint_held_s"], 100 * res["checkpoint_overhead"]))]
        if a.reference:
            rows.append(("uninterrupted: wall time, goodput", "%.1f s, %.3f" % (
                res["reference_wall_s"], res["reference_goodput"])))
            rows.append(("speed vs uninterrupted", "%.3f" % res["speed_vs_uninterrupted"]))
            rows.append(("final weights = uninterrupted run", "yes, bit for bit" if res["bitwise_equal"] else
                         "no (the job ran on fewer hosts: another summation order)" if a.recovery == "survivors" else "NO"))
        for k, v in rows:
            print("  %-36s %s" % (k, v))
        line = json.dumps(res, sort_keys=True)
        print(line)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")
        if a.keep:
            print("spot_sim: run folders kept in", work)
        # A job that changed size sums its gradients in another order: not bit for bit then.
        return 0 if res.get("bitwise_equal", True) or a.recovery == "survivors" else 1
    finally:
        hosts.down()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
