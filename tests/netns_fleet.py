"""A fleet of namespace hosts (tests/netns_hosts.sh) for the multi-host Python tests, one rank
each, launched by examples/resnet50/launch/mpirun.sh as a multi-node job is; with the kernel's
CPU quota a host can be given a share of a core (netns_hosts.sh quota), so that hosts sharing
this machine run at the speeds they are given. Also: reading a run's metrics records and
comparing checkpoints' weights."""
import json
import os
import shutil
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(REPO, "tests", "netns_hosts.sh")
LAUNCHER = os.path.join(REPO, "examples", "resnet50", "launch", "mpirun.sh")


class Fleet:
    """Hosts PREFIX-1..n; raises SystemExit(77) where namespaces cannot be made."""

    def __init__(self, prefix, n, work, spotrain):
        self.prefix, self.work, self.spotrain = prefix, work, spotrain
        up = subprocess.run([HOSTS, "up", prefix, str(n)], capture_output=True, text=True)
        if up.returncode == 77:
            raise SystemExit(77)
        if up.returncode != 0:
            raise RuntimeError("netns_hosts.sh up failed: " + up.stdout + up.stderr)
        self.agent, self.net = up.stdout.split()[:2]

    def address(self, i):
        return "%s.%d" % (self.net, i)

    def quota(self, i, share):
        """Host i gets `share` of a core ("none": no limit); SystemExit(77) where no cgroup can be made."""
        r = subprocess.run([HOSTS, "quota", self.prefix, str(i), str(share)], capture_output=True, text=True)
        if r.returncode == 77:
            raise SystemExit(77)
        if r.returncode != 0:
            raise RuntimeError("netns_hosts.sh quota failed: " + r.stdout + r.stderr)

    def pids(self, i):
        out = subprocess.run([HOSTS, "pids", self.prefix, str(i)], capture_output=True, text=True).stdout
        return [(int(p), n.strip()) for p, _, n in (l.partition(" ") for l in out.splitlines()) if p]

    def hostfile(self, hosts):
        path = os.path.join(self.work, "hosts-" + "".join(map(str, hosts)))
        with open(path, "w") as f:
            for i in hosts:
                f.write("%s slots=1\n" % self.address(i))
        return path

    def environment(self, discovery=False, env=None):
        e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 RANKS_PER_NODE="1", THREADS_PER_RANK="1", SPOTRAIN=self.spotrain,
                 MPI_IFNAME=self.net + ".0/24",
                 MPIRUN_ARGS="--mca plm_rsh_agent %s --mca rtc ^hwloc --mca btl tcp,self" % self.agent)
        if discovery:
            e.update(HOST_DISCOVERY="%s hosts %s" % (HOSTS, self.prefix), DISCOVERY_INTERVAL="0")
        e.update(env or {})
        return e

    def command(self, args, hosts, discovery=False):
        return [LAUNCHER, "-" if discovery else self.hostfile(hosts), str(len(hosts))] + args

    def launch(self, args, hosts=(1, 2, 3), discovery=False, env=None):
        """Runs the job to its end: (exit code, its output, seconds)."""
        t0 = time.time()
        r = subprocess.run(self.command(args, hosts, discovery), env=self.environment(discovery, env),
                           capture_output=True, text=True, timeout=400)
        return r.returncode, r.stdout + r.stderr, time.time() - t0

    def start(self, args, hosts=(1, 2, 3), env=None):
        """Starts the job in the background: a Popen whose output goes to a file in the work folder."""
        log = open(os.path.join(self.work, "job-%d.log" % int(time.time() * 1000)), "w+")
        p = subprocess.Popen(self.command(args, hosts), env=self.environment(False, env), stdout=log,
                             stderr=subprocess.STDOUT, text=True)
        p.log = log
        return p

    def down(self):
        subprocess.run([HOSTS, "down", self.prefix], capture_output=True)


def open_fleet(prefix, n, work, spotrain):
    """The fleet, or None with a line saying why it cannot be made here (the test then skips)."""
    try:
        return Fleet(prefix, n, work, spotrain)
    except SystemExit:
        print("skipped: network namespaces cannot be made here")
        return None


def start_fleet_test(name, prefix, n, spotrain, root_for):
    """A fleet test's start as root: (its work folder, its Checks, its Fleet of n hosts), or None
    with a line saying why it skips (not root, for `root_for`; or no namespaces here)."""
    if os.geteuid() != 0:
        print("skipped: needs root for " + root_for)
        return None
    work = tempfile.mkdtemp(prefix=name + ".")
    fleet = open_fleet(prefix, n, work, spotrain)
    if fleet is None:
        shutil.rmtree(work, ignore_errors=True)
        return None
    return work, Checks(), fleet


class Checks:
    """A test's checks: each printed "ok" or "FAIL" with what it checked, the failures kept."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)
        return ok

    def finish(self, work):
        """The test's exit code; its files are removed when every check passed, else kept and named."""
        if not self.failures:
            shutil.rmtree(work, ignore_errors=True)
            return 0
        print("%d check(s) failed; files kept in %s" % (len(self.failures), work))
        return 1


def records(run_dir):
    """The well-formed records of a run folder's metrics.jsonl (a torn last line skipped)."""
    out = []
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def same_weights(a, b):
    """Whether two checkpoints hold the same model and optimizer state, bit for bit."""
    for group in ("/model", "/optimizer"):
        if subprocess.run(["h5diff", "-q", a, b, group, group], capture_output=True).returncode != 0:
            return False
    return True
