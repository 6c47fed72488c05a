#!/usr/bin/python3
"""examples/resnet50/launch/slurm.sbatch under a real, private one-node Slurm.

The test installs Slurm and MUNGE where they are missing (Debian's slurm-wlm and munge), writes
its own slurm.conf (this host as the one node, two partitions: `spot`, preemptible with
PreemptMode=REQUEUE and GraceTime=60, and `high`, which preempts it; AuthInfo cred_expire=10, so
a requeued job waits 11 s instead of 121 s), starts its own munged, slurmctld and slurmd on free
ports, and always stops them again. One job (resnet20 on synthetic data, 2 tasks of one thread,
--deterministic) is submitted with sbatch options in place of the script's 2 x 8 GPU shape and
interrupted four times:
  a. `scancel --signal=USR1 JOB` (to the ranks, as --signal=USR1@180 before a time limit):
     both ranks stop after one step with a verified checkpoint (75), the script requeues the
     job, and it resumes;
  b. a preemption: a job submitted to `high` takes the node; the ranks get SIGTERM, stop with a
     verified checkpoint, the script requeues the job exactly once (Slurm itself does not:
     restarts goes up by one), and it resumes once the preemptor is done;
  c. `scancel --batch --signal=TERM JOB` (the batch shell alone): the script passes the stop to
     the ranks and requeues as in (a);
  d. rank 1 killed with SIGKILL: rank 0 saves the last step both finished (76), the script starts
     srun again inside the same allocation at once (no requeue), and the job finishes.
The final checkpoint must hold the same model and optimizer state, bit for bit (h5diff), as the
same job run under the same script without interruption. Two short jobs check HEALTH_CHECK=1:
the health gate passes the node and the job trains; with the node's doctor broken (the gate's
test hook) the gate names it and the job ends with 1 before any rank starts. Printed: each requeue's hold (the job's
EligibleTime - SubmitTime, SubmitTime being the requeue), each downtime (the stop record to the
first step after the restart) and the in-place restart's downtime.
Exit 77 (skipped) when not root, or when Slurm cannot be installed or its daemons cannot start.

  tests/test_slurm.py SPOTRAIN_BINARY
"""
import ctypes
import datetime
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH_SCRIPT = os.path.join(REPO, "examples", "resnet50", "launch", "slurm.sbatch")
STEPS = 300
MARGIN = 15  # steps trained after each start before the next interruption
CRED_EXPIRE = 10  # a requeued job is held cred_expire + 1 s (Slurm's default: 120)
PATH = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
_libc = ctypes.CDLL(None, use_errno=True)


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def die_with_test():
    """preexec_fn: the daemon gets SIGKILL if the test process dies first (even by SIGKILL)."""
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def which(tool):
    return shutil.which(tool, path=PATH)


def ensure_slurm():
    tools = ["slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "scancel", "squeue",
             "munged"]
    if all(which(t) for t in tools):
        return
    log("installing slurm-wlm and munge (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", PATH=PATH)
    # No service may start from the packages' scripts (a policy-rc.d that says no, for the
    # length of the install, unless the machine has one).
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    if made_policy:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise Skip("cannot install Slurm: %s: %s" % (" ".join(cmd), (r.stderr or r.stdout)[-500:]))
    finally:
        if made_policy:
            os.unlink(policy)
    missing = [t for t in tools if not which(t)]
    if missing:
        raise Skip("Slurm installed, but %s not found" % ", ".join(missing))


def processes_in(folder):
    """The processes whose working folder is folder or below: the daemons started there, and the
    jobs' steps, scripts and ranks (submitted from there)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % d)
        except OSError:
            continue
        if cwd == folder or cwd.startswith(folder + "/"):
            pids.append(int(d))
    return pids


def start_reaper(work):
    """A process outside this one's tree that, should this test die without its teardown (a
    SIGKILL at a timeout), kills what is left of the jobs and removes the folder. The daemons
    themselves die with the test (PR_SET_PDEATHSIG); the job steps' slurmstepd do not."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while os.path.isdir(work):
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                for _ in range(3):
                    for p in processes_in(work):
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(1)
                shutil.rmtree(work, ignore_errors=True)
                break
            time.sleep(0.5)
    finally:
        os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_time(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()


def record_time(rec):
    return datetime.datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


class Cluster:
    def __init__(self, work):
        self.work = work
        self.conf = os.path.join(work, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf, PATH=PATH)
        for k in list(self.env):
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]  # nothing from an allocation this test may run in
        self.procs = {}
        self.host = socket.gethostname().split(".")[0]
        self.cpus = max(2, os.cpu_count() or 1)

    def logs(self, n=30):
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            p = os.path.join(self.work, name)
            if os.path.exists(p):
                lines = open(p, errors="replace").read().splitlines()[-n:]
                out.append("--- %s (last %d lines)\n%s" % (name, len(lines), "\n".join(lines)))
        return "\n".join(out)

    def run(self, *cmd, check=True, timeout=60):
        r = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise Fail("%s exited %d: %s" % (" ".join(cmd), r.returncode, (r.stderr + r.stdout).strip()))
        return r.stdout

    def start(self):
        w = self.work
        munge_dir = os.path.join(w, "munge")
        os.makedirs(munge_dir, mode=0o755)
        key = os.path.join(munge_dir, "munge.key")
        with open(key, "wb") as f:
            f.write(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(munge_dir, "munge.socket")
        for d in ("state", "spool"):
            os.makedirs(os.path.join(w, d))
        plugstack = os.path.join(w, "plugstack.conf")
        open(plugstack, "w").close()
        conf = """\
ClusterName=spotraintest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire={cred_expire}
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd.pid
SlurmctldLogFile={w}/slurmctld.log
SlurmdLogFile={w}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={plugstack}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobRequeue=1
MinJobAge=300
KillWait=30
ReturnToService=2
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=spot Nodes={host} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=60
PartitionName=high Nodes={host} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
""".format(host=self.host, ctld_port=free_port(), slurmd_port=free_port(), sock=sock,
           cred_expire=CRED_EXPIRE, w=w, plugstack=plugstack, cpus=self.cpus)
        with open(self.conf, "w") as f:
            f.write(conf)

        def spawn(name, cmd):
            out = open(os.path.join(w, name + ".out"), "w")
            self.procs[name] = subprocess.Popen(cmd, cwd=w, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True,
                                                preexec_fn=die_with_test)

        spawn("munged", [which("munged"), "-F", "-f", "--socket=" + sock, "--key-file=" + key,
                         "--pid-file=" + os.path.join(munge_dir, "munged.pid"),
                         "--log-file=" + os.path.join(w, "munged.log"),
                         "--seed-file=" + os.path.join(munge_dir, "munged.seed")])
        deadline = time.time() + 15
        while not os.path.exists(sock):
            if self.procs["munged"].poll() is not None or time.time() > deadline:
                raise Skip("munged did not start\n" + self.logs())
            time.sleep(0.1)
        spawn("slurmctld", [which("slurmctld"), "-D", "-c", "-i"])
        spawn("slurmd", [which("slurmd"), "-D", "-N", self.host])
        deadline = time.time() + 40
        state = ""
        while time.time() < deadline:
            for name in ("slurmctld", "slurmd"):
                if self.procs[name].poll() is not None:
                    raise Skip("%s exited %d at start\n%s\n%s" % (
                        name, self.procs[name].returncode,
                        open(os.path.join(w, name + ".out"), errors="replace").read()[-2000:], self.logs()))
            r = subprocess.run(["sinfo", "-h", "-n", self.host, "-o", "%T"], env=self.env,
                               capture_output=True, text=True)
            state = r.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            raise Skip("the node did not come up (state %r)\n%s" % (state, self.logs()))
        mpis = self.run("srun", "--mpi=list")
        if "pmix" not in mpis:
            raise Skip("srun has no pmix plugin (srun --mpi=list: %s)" % " ".join(mpis.split()))

    def job(self, job_id):
        """scontrol show job as a dict, or None once the record is gone."""
        r = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env, capture_output=True,
                           text=True)
        if r.returncode != 0 or "JobId=" not in r.stdout:
            return None
        return dict(m.groups() for m in re.finditer(r"(\S+?)=(\S*)", r.stdout))

    def stop(self):
        """Cancels every job, waits for the steps to go, stops the daemons, and kills whatever of
        the jobs' is left (processes whose folder is this test's: steps, ranks)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True)
            deadline = time.time() + 45
            while time.time() < deadline:
                r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
                if r.returncode != 0 or not r.stdout.strip():
                    break
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        mine = processes_in(self.work)
        for pid in mine:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return mine


def records(run_dir):
    p = os.path.join(run_dir, "metrics.jsonl")
    out = []
    if os.path.exists(p):
        for line in open(p, errors="replace"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return out


def starts(recs):
    """The records split at each 'start' (one list per start of the ranks)."""
    parts = []
    for r in recs:
        if r.get("type") == "start":
            parts.append([])
        if parts:
            parts[-1].append(r)
    return parts


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise Fail("timed out after %d s waiting for %s" % (timeout, what))


def main():
    spotrain = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        log("skipped: needs root (it runs its own Slurm daemons)")
        return 77
    if not os.access(spotrain, os.X_OK):
        log("FAIL: no spotrain binary at %s" % spotrain)
        return 1
    if not which("h5diff"):
        log("skipped: h5diff (hdf5-tools) is missing")
        return 77
    try:
        ensure_slurm()
    except Skip as e:
        log("skipped: %s" % e)
        return 77
    work = tempfile.mkdtemp(prefix="spotrain-slurm.")
    start_reaper(work)
    cluster = Cluster(work)
    failures = []
    job_out = {}

    def fail(msg):
        failures.append(msg)
        log("FAIL: " + msg)

    try:
        try:
            cluster.start()
        except Skip as e:
            log("skipped: %s" % e)
            return 77
        log("slurm: one node %s, %d CPUs, partitions spot (PreemptMode=REQUEUE GraceTime=60) and high; "
            "cred_expire=%d" % (cluster.host, cluster.cpus, CRED_EXPIRE))
        env = dict(cluster.env, SPOTRAIN=spotrain)

        def submit(name, run_dir, extra_env=None, steps=STEPS):
            out = subprocess.run(
                ["sbatch", "--parsable", "--partition=spot", "--job-name=" + name, "--nodes=1",
                 "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0", "--time=10",
                 "--output=" + os.path.join(work, name + "-%j.out"), SBATCH_SCRIPT,
                 "--model", "resnet20", "--data", "synthetic", "--steps", str(steps), "--batch-size", "8",
                 "--deterministic", "--log-every", "1", "--keep", "50", "--ckpt-dir", run_dir],
                cwd=work, env=dict(env, **(extra_env or {})), capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                raise Fail("sbatch exited %d: %s" % (out.returncode, out.stderr.strip()))
            job_id = out.stdout.strip().split(";")[0]
            job_out[job_id] = os.path.join(work, "%s-%s.out" % (name, job_id))
            return job_id

        def output(job_id):
            p = job_out[job_id]
            return open(p, errors="replace").read() if os.path.exists(p) else ""

        def finished(job_id, timeout):
            def done():
                j = cluster.job(job_id)
                return j if j and j["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                     "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED") else None
            return wait_for("job %s to end" % job_id, done, timeout)

        def verify(path, what):
            r = subprocess.run([spotrain, "ckpt", "verify", path], capture_output=True, text=True)
            if r.returncode != 0:
                fail("%s: `spotrain ckpt verify %s` exited %d: %s" % (what, path, r.returncode,
                                                                      (r.stderr + r.stdout).strip()))

        # The uninterrupted run: the same job under the same script.
        t0 = time.time()
        ref_dir = os.path.join(work, "run-ref")
        ref = submit("reference", ref_dir)
        j = finished(ref, 240)
        if j["JobState"] != "COMPLETED" or j["ExitCode"] != "0:0" or j["Restarts"] != "0":
            raise Fail("the uninterrupted job ended %s, exit %s, %s restarts\n%s" % (
                j["JobState"], j["ExitCode"], j["Restarts"], output(ref)))
        log("uninterrupted job %s: %d steps in %.1f s" % (ref, STEPS, time.time() - t0))

        # HEALTH_CHECK=1: the health gate through srun on the allocation's one node (its doctor; no
        # links to measure on one node), then the job trains; with that node's doctor broken (the
        # gate's test hook) the gate names it and the job ends with 1 before any rank starts.
        gate_env = {"HEALTH_CHECK": "1", "HEALTH_DOCTOR_ARGS": "--model resnet20 --steps 1 --precision fp32",
                    "HEALTH_GATE": os.path.join(REPO, "examples", "resnet50", "launch", "health_gate.sh")}
        t_gate = time.time()
        gated = submit("gated", os.path.join(work, "run-gated"), gate_env, steps=4)
        j = finished(gated, 120)
        if j["JobState"] != "COMPLETED" or "health gate: 1 of 1 host(s) passed" not in output(gated):
            fail("HEALTH_CHECK=1: the job ended %s without the gate passing its node\n%s" % (
                j["JobState"], output(gated)))
        broken = submit("gated-broken", os.path.join(work, "run-broken"),
                        dict(gate_env, HEALTH_TEST_BREAK_HOST=cluster.host), steps=4)
        j = finished(broken, 120)
        out_broken = output(broken)
        if (j["JobState"] != "FAILED" or "left out %s: doctor: fail ops cpu blocked_fp32" % cluster.host not in out_broken
                or "fewer than MIN_HOSTS=1; not starting" not in out_broken or "step 1/" in out_broken):
            fail("HEALTH_CHECK=1 with the node's doctor broken: the job ended %s\n%s" % (j["JobState"], out_broken))
        log("health gate under Slurm: a healthy node trained, a broken one was named and the job ended 1 "
            "(both jobs %.1f s)" % (time.time() - t_gate))

        run_dir = os.path.join(work, "run")
        # Each step 0.05 s or more (SPOTRAIN_STEP_DELAY): the four interruptions, each MARGIN steps
        # into a start and then as late as Slurm acts, come long before step STEPS on a machine of
        # any speed (on a loaded 2-core one, after steps 17, 40, 58 and 74).
        job = submit("interrupted", run_dir, {"SPOTRAIN_STEP_DELAY": "0.05"})

        def steps_in(start_index):
            parts = starts(records(run_dir))
            if len(parts) <= start_index:
                return None
            s = [r["step"] for r in parts[start_index] if r.get("type") == "step"]
            return (s[0], s[-1]) if s else None

        def wait_steps(start_index, at_least, what):
            # at_least steps trained in start number start_index (0-based)
            return wait_for(what, lambda: (lambda s: s if s and s[1] - s[0] + 1 >= at_least else None)(
                steps_in(start_index)), 180)

        def restarts():
            j = cluster.job(job)
            return int(j["Restarts"]) if j else -1

        holds = []

        def requeue_cycle(label, start_index, interrupt, expect_ranks_75=True):
            """Interrupts start number start_index; expects a stop record with a verified checkpoint,
            one requeue, and the ranks started again (start_index + 1)."""
            wait_steps(start_index, MARGIN, "%d steps before %s" % (MARGIN, label))
            before = restarts()
            interrupt()
            stop = wait_for("a stop record after %s" % label, lambda: next(
                (r for r in starts(records(run_dir))[start_index] if r.get("type") == "stop"), None), 120)
            verify(stop["checkpoint"], label)
            wait_for("job %s requeued after %s" % (job, label), lambda: restarts() == before + 1, 60)
            wait_steps(start_index + 1, 1, "the job to train again after %s" % label)
            # A requeued job's SubmitTime is the requeue's time, EligibleTime the end of the hold
            # (read once it runs again: the record takes a moment to show the requeue).
            j = cluster.job(job)
            requeued, eligible = slurm_time(j["SubmitTime"]), slurm_time(j["EligibleTime"])
            if requeued < record_time(stop) - 1:
                fail("%s: the job's SubmitTime %s is before the stop: not the requeue's time" % (
                    label, j["SubmitTime"]))
            if int(j["Restarts"]) != before + 1:
                fail("%s: the job was requeued %d times, not once" % (label, int(j["Restarts"]) - before))
            first = next(r for r in starts(records(run_dir))[start_index + 1] if r.get("type") == "step")
            resume = next((r for r in starts(records(run_dir))[start_index + 1] if r.get("type") == "resume"), None)
            if not resume or resume.get("step") != stop["step"]:
                fail("%s: the restart did not resume from the stop checkpoint (step %s): %r" % (
                    label, stop["step"], resume))
            hold = eligible - requeued
            holds.append(hold)
            log("%s: the ranks stopped after step %d (checkpoint verified); requeued; held %.0f s "
                "(EligibleTime - SubmitTime), started %.0f s after the requeue; first step %.1f s after "
                "the stop" % (label, stop["step"], hold, slurm_time(j["StartTime"]) - requeued,
                              record_time(first) - record_time(stop)))
            if not CRED_EXPIRE <= hold <= CRED_EXPIRE + 3:
                fail("%s: the requeue hold was %.0f s, not cred_expire + 1 = %d s" % (label, hold, CRED_EXPIRE + 1))
            return stop

        # a. SIGUSR1 to the steps (what --signal=USR1@180 sends before the time limit)
        requeue_cycle("a. scancel --signal=USR1", 0, lambda: cluster.run("scancel", "--signal=USR1", job))
        if not re.search(r"tasks? 0-1: Exited with exit code 75", output(job)):
            fail("a: srun did not report both ranks exiting 75\n" + output(job))

        # b. a preemption: a job in the higher partition needs every CPU of the node
        high = []

        def preempt():
            r = subprocess.run(["sbatch", "--parsable", "--partition=high", "--ntasks=%d" % cluster.cpus,
                                "--output=/dev/null", "--wrap", "sleep 1"], cwd=work, env=env,
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise Fail("sbatch of the preempting job exited %d: %s" % (r.returncode, r.stderr.strip()))
            high.append(r.stdout.strip().split(";")[0])

        requeue_cycle("b. preemption", 1, preempt)
        h = cluster.job(high[0])
        if not h or h["JobState"] != "COMPLETED":
            fail("b: the preempting job %s did not run (%s)" % (high[0], h and h["JobState"]))

        # c. SIGTERM to the batch shell alone: the script's trap passes it on to the ranks
        requeue_cycle("c. scancel --batch --signal=TERM", 2,
                      lambda: cluster.run("scancel", "--batch", "--signal=TERM", job))

        # d. rank 1 killed without notice: rank 0 saves, 76, srun again in the same allocation
        wait_steps(3, MARGIN, "%d steps before killing a rank" % MARGIN)
        before = restarts()
        pids = cluster.run("scontrol", "listpids", job)
        rank1 = [int(f[0]) for f in (l.split() for l in pids.splitlines()[1:])
                 if len(f) >= 5 and f[2] != "batch" and f[4] == "1"]
        if len(rank1) != 1:
            raise Fail("d: cannot find rank 1 in `scontrol listpids %s`:\n%s" % (job, pids))
        killed_at = time.time()
        os.kill(rank1[0], signal.SIGKILL)
        lost = wait_for("a lost_peer record", lambda: next(
            (r for r in starts(records(run_dir))[3] if r.get("type") == "lost_peer"), None), 120)
        if not lost.get("saved") or not lost.get("checkpoint"):
            fail("d: the surviving rank did not save: %r" % lost)
        else:
            verify(lost["checkpoint"], "d. the survivor's checkpoint")
        wait_steps(4, 1, "the ranks to train again in the same allocation")
        part = starts(records(run_dir))[4]
        first = next(r for r in part if r.get("type") == "step")
        resume = next((r for r in part if r.get("type") == "resume"), None)
        log("d. rank 1 SIGKILLed: rank 0 saved step %s %.1f s later; srun started again in the "
            "allocation: resumed %.1f s and first step %.1f s after the save (%.1f s after the kill)" % (
                lost.get("step"), record_time(lost) - killed_at,
                record_time(resume) - record_time(lost) if resume else float("nan"),
                record_time(first) - record_time(lost), record_time(first) - killed_at))
        if restarts() != before:
            fail("d: the job was requeued (restarts %d -> %d) instead of restarting in place" % (before, restarts()))
        if not re.search(r"a peer was lost; starting again in this allocation", output(job)):
            fail("d: the script did not say it restarted in place")

        j = finished(job, 240)
        if j["JobState"] != "COMPLETED" or j["ExitCode"] != "0:0":
            fail("the interrupted job ended %s, exit %s" % (j["JobState"], j["ExitCode"]))
        if j["Restarts"] != "3":
            fail("the interrupted job was requeued %s times, not 3" % j["Restarts"])
        final = os.path.join(run_dir, "ckpt-%08d.h5" % STEPS)
        ref_final = os.path.join(ref_dir, "ckpt-%08d.h5" % STEPS)
        for group in ("/model", "/optimizer"):
            r = subprocess.run(["h5diff", "-q", ref_final, final, group, group], capture_output=True, text=True)
            if r.returncode != 0:
                fail("%s differs from the uninterrupted run's (%s): %s" % (group, final, r.stdout + r.stderr))
        if not any("differs" in f for f in failures):
            log("final checkpoint: model and optimizer bit-identical to the uninterrupted run's")
        log("requeue holds: %s s (cred_expire=%d); total %.0f s" % (
            ", ".join("%.0f" % h for h in holds), CRED_EXPIRE, time.time() - t0))
    except Fail as e:
        fail(str(e))
    finally:
        if failures:
            for job_id, p in job_out.items():
                if os.path.exists(p):
                    lines = [l for l in open(p, errors="replace").read().splitlines()
                             if not re.match(r"\d\d:\d\d:\d\d epoch \d+/\d+ step ", l)]
                    log("--- output of job %s, without its progress lines (last 60)\n%s" % (
                        job_id, "\n".join(lines[-60:])))
            log(cluster.logs())
        left = cluster.stop()
        if left:
            log("note: killed %d leftover process(es) of the jobs: %s" % (len(left), left))
        time.sleep(0.5)
        still = [n for n, p in cluster.procs.items() if p.poll() is None] + [str(p) for p in processes_in(work)]
        if still:
            failures.append("still running after the teardown: %s" % ", ".join(still))
            log("FAIL: " + failures[-1])
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
