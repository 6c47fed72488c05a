#!/usr/bin/env python3
"""A reclaimed Kubernetes worker comes back (examples/resnet50/launch: worker.sh, mpijob.yaml,
mpirun.sh), checked with stubs, without a cluster:

- worker.sh, run with a stub sshd and stub `spotrain` ranks in a PID namespace of its own (so
  its pgrep/pkill see only them, as in a pod): a SIGTERM reaches every rank, worker.sh waits for
  them (at most STOP_WAIT s) and only then stops sshd, and exits 143 (SIGINT: 130), never 0;
  an sshd that ends on its own passes its exit status through; STOP_WAIT and SSHD are checked
  before sshd starts.
- mpijob.yaml: the Worker and the Launcher have restartPolicy OnFailure; the launcher takes its
  hosts from a HOST_DISCOVERY command that lists only the workers that answer ssh (run here on
  a stub discover_hosts.sh and a stub ssh), and waits for all of them (MIN_HOSTS).
- mpirun.sh with such a discovery command: a start that cannot reach a host it listed (mpirun's
  255) is restarted, and the restart waits for the host to be back instead of failing.

Exit 77 (skipped) where a PID namespace cannot be made; the other checks run first.

  tests/test_k8s_reclaim.py [LAUNCH_DIR]     (default: examples/resnet50/launch)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A rank of the job: logs its start; on SIGTERM waits STUB_TERM_DELAY s, logs and exits 75 (a
# stop with a checkpoint), or with STUB_IGNORE_TERM=1 logs the signal and goes on (a rank that
# does not finish its stop in time). Its process name is `spotrain`, as worker.sh looks for.
STUB_RANK = r"""#!/bin/bash
log() { printf '%s %s\n' "$EPOCHREALTIME" "$*" >> "$STUB_LOG"; }
log "rank $$ start"
if [[ "${STUB_IGNORE_TERM:-0}" == 1 ]]; then
  trap 'log "rank $$ term"' TERM
else
  trap 'log "rank $$ term"; sleep "${STUB_TERM_DELAY:-0.2}"; log "rank $$ exit 75"; exit 75' TERM
fi
while :; do sleep 0.05; done
"""

# sshd: starts N ranks (as mpirun would, through sshd), then serves until SIGTERM; with
# STUB_SSHD_EXIT it ends on its own 0.3 s later with that status.
STUB_SSHD = r"""#!/bin/bash
log() { printf '%s %s\n' "$EPOCHREALTIME" "$*" >> "$STUB_LOG"; }
log "sshd start"
trap 'log "sshd term"; exit 0' TERM
for ((i = 0; i < ${1:-0}; i++)); do spotrain & done
if [[ -n "${STUB_SSHD_EXIT:-}" ]]; then
  sleep 0.3
  log "sshd exit $STUB_SSHD_EXIT"
  exit "$STUB_SSHD_EXIT"
fi
while :; do sleep 0.05; done
"""

# The PID namespace's init, as tini in the pod: runs worker.sh and exits with its status.
INIT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]) & 255)"

failures = []


def check(ok, what):
    print(("PASS: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def write_exec(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(d))
    return out


def namespace_prefix():
    """unshare's command for a PID namespace with its own /proc; None where none can be made."""
    if not shutil.which("unshare"):
        return None
    tries = [["unshare", "--user", "--map-root-user"]]
    if os.geteuid() == 0:
        tries.insert(0, ["unshare"])
    for t in tries:
        p = t + ["--pid", "--fork", "--mount-proc", "--kill-child"]
        if subprocess.run(p + ["true"], capture_output=True).returncode == 0:
            return p
    return None


class WorkerRun:
    """worker.sh under the namespace's init, with the stub sshd starting RANKS stub ranks."""

    def __init__(self, ns, worker, tmp, ranks, env):
        self.log = os.path.join(tmp, "log")
        if os.path.exists(self.log):
            os.remove(self.log)
        open(self.log, "w").close()
        e = dict(os.environ)
        e["PATH"] = os.path.join(tmp, "bin") + ":" + e["PATH"]
        e["STUB_LOG"] = self.log
        e["SSHD"] = "%s %d" % (os.path.join(tmp, "sshd-stub"), ranks)
        e.pop("STOP_WAIT", None)
        e.update(env)
        self.ranks = ranks
        self.proc = subprocess.Popen(ns + [sys.executable, "-c", INIT, worker], env=e,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.sent = None

    def events(self):
        with open(self.log) as f:
            return [(float(t), ev) for t, ev in (line.rstrip("\n").split(" ", 1) for line in f if " " in line)]

    def started(self, timeout=15):
        """Waits for sshd and every rank to have started."""
        end = time.time() + timeout
        while time.time() < end:
            evs = [e for _, e in self.events()]
            if "sshd start" in evs and sum(e.endswith(" start") and e.startswith("rank") for e in evs) >= self.ranks:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def worker_pid(self):
        for _ in range(200):
            for init in children(self.proc.pid):
                kids = children(init)
                if kids:
                    return kids[0]
            time.sleep(0.05)
        return None

    def signal(self, sig):
        pid = self.worker_pid()
        check(pid is not None, "found worker.sh's process to signal")
        if pid is not None:
            self.sent = time.time()
            os.kill(pid, sig)

    def finish(self, timeout=30):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            err += "\n(killed by the test after %d s)" % timeout
        self.ended = time.time()
        self.rc = self.proc.returncode
        self.err = err
        return self.rc


def rank_events(evs, what):
    return [t for t, e in evs if e.startswith("rank ") and e.endswith(" " + what)]


def one(evs, what):
    ts = [t for t, e in evs if e == what]
    return ts[0] if ts else None


def worker_checks(ns, worker, tmp):
    os.makedirs(os.path.join(tmp, "bin"), exist_ok=True)
    write_exec(os.path.join(tmp, "bin", "spotrain"), STUB_RANK)
    write_exec(os.path.join(tmp, "sshd-stub"), STUB_SSHD)

    # A stop signal while two ranks run; they take 1 s to stop.
    r = WorkerRun(ns, worker, tmp, 2, {"STUB_TERM_DELAY": "1.0"})
    ok = r.started()
    check(ok, "worker.sh started the stub sshd and its 2 ranks")
    if ok:
        r.signal(signal.SIGTERM)
    r.finish()
    evs = r.events()
    terms, exits, sshd_term = rank_events(evs, "term"), rank_events(evs, "exit 75"), one(evs, "sshd term")
    print("  SIGTERM: exit %s after %.2f s; stderr: %s" % (r.rc, r.ended - (r.sent or r.ended), r.err.strip()))
    check(len(terms) == 2, "SIGTERM to worker.sh reached both ranks as SIGTERM (%d of 2)" % len(terms))
    check(len(exits) == 2 and sshd_term is not None and sshd_term >= max(exits),
          "worker.sh stopped sshd only after both ranks had ended")
    check(r.sent is not None and r.ended - r.sent >= 1.0,
          "worker.sh waited for the ranks' 1 s stop before it exited")
    check(r.rc == 143, "worker.sh exits 143 after SIGTERM (got %s)" % r.rc)
    check("asking this pod's ranks to stop" in r.err, "worker.sh says it asks the ranks to stop")

    # SIGINT: the same stop, 130.
    r = WorkerRun(ns, worker, tmp, 1, {"STUB_TERM_DELAY": "0.2"})
    if r.started():
        r.signal(signal.SIGINT)
    r.finish()
    check(len(rank_events(r.events(), "exit 75")) == 1 and r.rc == 130,
          "SIGINT: the rank stopped, worker.sh exits 130 (got %s)" % r.rc)

    # Ranks that do not stop: worker.sh gives up after STOP_WAIT and still exits 143.
    r = WorkerRun(ns, worker, tmp, 2, {"STUB_IGNORE_TERM": "1", "STOP_WAIT": "1"})
    if r.started():
        r.signal(signal.SIGTERM)
    r.finish()
    took = r.ended - (r.sent or r.ended)
    print("  STOP_WAIT=1, ranks that ignore SIGTERM: exit %s after %.2f s" % (r.rc, took))
    check(len(rank_events(r.events(), "term")) == 2, "STOP_WAIT=1: both ranks got SIGTERM")
    check(1.0 <= took < 8.0 and "ranks still running after 1 s" in r.err,
          "STOP_WAIT=1: worker.sh waited about 1 s for ranks that did not stop, and said so")
    check(r.rc == 143, "STOP_WAIT=1: worker.sh exits 143 (got %s)" % r.rc)

    # A leading zero is decimal: STOP_WAIT=09 is nine seconds, not an arithmetic error that
    # drops the wait (and with it the ranks' checkpoint).
    r = WorkerRun(ns, worker, tmp, 1, {"STOP_WAIT": "09", "STUB_TERM_DELAY": "0.3"})
    if r.started():
        r.signal(signal.SIGTERM)
    r.finish()
    evs = r.events()
    exits, sshd_term = rank_events(evs, "exit 75"), one(evs, "sshd term")
    check(len(exits) == 1 and sshd_term is not None and sshd_term >= exits[0] and r.rc == 143
          and "value too great" not in r.err,
          "STOP_WAIT=09: worker.sh waited for the rank and exits 143 (got %s; %s)" % (r.rc, r.err.strip()))

    # No rank on this worker (between two starts of the job): still 143, at once.
    r = WorkerRun(ns, worker, tmp, 0, {})
    if r.started():
        r.signal(signal.SIGTERM)
    r.finish()
    check(r.rc == 143 and one(r.events(), "sshd term") is not None and "asking" not in r.err,
          "no rank running: SIGTERM stops sshd and worker.sh exits 143 (got %s)" % r.rc)

    # sshd ending on its own: its status is worker.sh's.
    for code in ("3", "0"):
        r = WorkerRun(ns, worker, tmp, 0, {"STUB_SSHD_EXIT": code})
        r.finish()
        check(r.rc == int(code), "sshd ending on its own with %s: worker.sh exits %s (got %s)" % (code, code, r.rc))

    # Settings checked before sshd starts: one error line, exit 2.
    bad = [({"STOP_WAIT": v}, "STOP_WAIT") for v in ("abc", "-1", "1.5", " 5", "1234567", "99999999999999999999")]
    bad.append(({"SSHD": "   "}, "SSHD"))
    for env, name in bad:
        r = WorkerRun(ns, worker, tmp, 0, env)
        r.finish(timeout=5)
        lines = r.err.strip().splitlines()
        check(r.rc == 2 and len(lines) == 1 and lines[0].startswith("error: " + name)
              and one(r.events(), "sshd start") is None,
              "%s=%r refused with one error line and exit 2, sshd not started (got %s: %s)"
              % (name, list(env.values())[0], r.rc, r.err.strip()))


def yaml_checks(launch, tmp):
    with open(os.path.join(launch, "mpijob.yaml")) as f:
        text = f.read()

    def replica(name):
        m = re.search(r"^    %s:\n((?:      .*\n|\s*\n)*?)      template:" % name, text, re.M)
        return m.group(1) if m else ""

    for name in ("Worker", "Launcher"):
        check(re.search(r"^      restartPolicy: OnFailure\b", replica(name), re.M) is not None,
              "mpijob.yaml: the %s replica has restartPolicy OnFailure" % name)
    m = re.search(r"\{name: HOST_DISCOVERY, value: '((?:[^']|'')*)'\}", text)
    disc = m.group(1).replace("''", "'") if m else ""
    check(bool(disc), "mpijob.yaml: the launcher sets HOST_DISCOVERY")
    check(bool(disc) and "$(" not in disc and "$$" not in disc,
          "mpijob.yaml: HOST_DISCOVERY holds no $( or $$, which Kubernetes would expand")
    workers = re.search(r"^    Worker:\n      replicas: (\d+)", text, re.M)
    min_hosts = re.search(r'\{name: MIN_HOSTS, value: "(\d+)"\}', text)
    check(bool(workers and min_hosts and workers.group(1) == min_hosts.group(1)),
          "mpijob.yaml: MIN_HOSTS is the Worker replicas (a restart waits for every worker)")
    args = re.search(r"^              args:\n\s+- (\S+)", text, re.M)
    check(bool(args) and args.group(1) == '"-"', "mpijob.yaml: mpirun.sh's HOSTFILE is - (hosts from HOST_DISCOVERY)")
    if not disc:
        return

    # The command on a stub of the operator's /etc/mpi/discover_hosts.sh (three Running workers)
    # and a stub ssh that answers for the hosts in a file.
    d = os.path.join(tmp, "disc")
    os.makedirs(os.path.join(d, "bin"), exist_ok=True)
    lister = os.path.join(d, "discover_hosts.sh")
    write_exec(lister, "#!/bin/sh\necho w0.job.ns.svc\necho w1.job.ns.svc\necho w2.job.ns.svc\n")
    answering = os.path.join(d, "answering")
    write_exec(os.path.join(d, "bin", "ssh"), """#!/bin/bash
while [[ $# -gt 0 ]]; do
  case $1 in -o) shift 2 ;; -*) shift ;; *) break ;; esac
done
grep -qx "$1" %s
""" % answering)
    env = dict(os.environ, PATH=os.path.join(d, "bin") + ":" + os.environ["PATH"])

    def discover(up, script=lister):
        with open(answering, "w") as f:
            f.write("".join(h + ".job.ns.svc\n" for h in up))
        r = subprocess.run(["bash", "-c", disc.replace("/etc/mpi/discover_hosts.sh", script)],
                           env=env, capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout.split()

    rc, hosts = discover(["w0", "w2"])
    check(rc == 0 and hosts == ["w0.job.ns.svc", "w2.job.ns.svc"],
          "HOST_DISCOVERY lists the workers that answer ssh, not the one that does not (%s, %s)" % (rc, hosts))
    rc, hosts = discover(["w0", "w1"])
    check(rc == 0 and hosts == ["w0.job.ns.svc", "w1.job.ns.svc"],
          "HOST_DISCOVERY succeeds when the last worker listed does not answer (%s, %s)" % (rc, hosts))
    rc, _ = discover(["w0"], script=os.path.join(d, "missing.sh"))
    check(rc != 0, "HOST_DISCOVERY fails when the operator's discover_hosts.sh is missing (%s)" % rc)


def launcher_checks(launch, tmp):
    """mpirun.sh, discovery on: the job stops (75) for a reclaim; the restart's start races the
    leaving worker (still listed, ssh fails: mpirun's 255); the worker is back 2 s later."""
    d = os.path.join(tmp, "launcher")
    os.makedirs(d, exist_ok=True)
    up = os.path.join(d, "up")
    with open(up, "w") as f:
        f.write("w0\nw1\n")
    calls = os.path.join(d, "calls")
    write_exec(os.path.join(d, "mpirun"), r"""#!/bin/bash
n=$(( $(cat %(calls)s 2>/dev/null || echo 0) + 1 ))
echo "$n" > %(calls)s
hostfile=
for ((i = 1; i <= $#; i++)); do [[ "${!i}" == --hostfile ]] && { j=$((i + 1)); hostfile=${!j}; }; done
{ echo "call $n: $*"; sed "s/^/call $n host: /" "$hostfile"; } >> %(calls)s.log
case $n in
  1) echo "stopped with a checkpoint"; exit 75 ;;
  2) echo "ssh: connect to host w1 port 22: Connection refused" >&2
     echo "w0" > %(up)s
     ( sleep 2; echo "w1" >> %(up)s ) </dev/null >/dev/null 2>&1 &
     exit 255 ;;
  *) exit 0 ;;
esac
""" % {"calls": calls, "up": up})
    env = dict(os.environ, MPIRUN=os.path.join(d, "mpirun"), SPOTRAIN="/bin/true", HOST_DISCOVERY="cat " + up,
               MIN_HOSTS="2", RANKS_PER_NODE="8", MAX_RESTARTS="3", RESTART_DELAY="1",
               RESTART_DELAY_MAX="1", HOST_WAIT_MAX="30", DISCOVERY_INTERVAL="0")
    t0 = time.time()
    r = subprocess.run([os.path.join(launch, "mpirun.sh"), "-", "16", "--epochs", "1"], env=env,
                       capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    log = open(calls + ".log").read() if os.path.exists(calls + ".log") else ""
    n = int(open(calls).read()) if os.path.exists(calls) else 0
    print("  mpirun.sh: exit %d after %.1f s, %d mpirun call(s)" % (r.returncode, took, n))
    check(r.returncode == 0 and n == 3,
          "mpirun.sh restarts after a start that could not reach a listed host (255) and "
          "succeeds once the host is back (exit %d, %d calls)" % (r.returncode, n))
    check("fewer than MIN_HOSTS=2; asking again" in r.stderr,
          "mpirun.sh waited for the worker to be back before starting again")
    check("call 3 host: w0 slots=8" in log and "call 3 host: w1 slots=8" in log and
          re.search(r"call 3: .*-np 16 .*--resume", log) is not None,
          "the last start runs on both workers, 16 ranks, resuming")
    if failures:
        print(r.stdout + r.stderr)


def main():
    launch = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(REPO, "examples", "resnet50", "launch")
    with tempfile.TemporaryDirectory() as tmp:
        yaml_checks(launch, tmp)
        launcher_checks(launch, tmp)
        ns = namespace_prefix()
        if ns is None:
            print("worker.sh checks skipped: cannot make a PID namespace here (unshare)")
        else:
            worker_checks(ns, os.path.join(launch, "worker.sh"), tmp)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    if ns is None:
        return 77
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
