#!/usr/bin/python3
"""Hostile input: files and flags made to break the engine are refused, never obeyed or crashed on.

Every refusal must exit 1 or 2 (never 0, never a signal), within 60 s (a longer run is a hang),
with exactly one stderr line starting with `error:` that names the input or the cause, and no
`terminate called`, `Segmentation`, `json.exception`, `vector::` or `bad_alloc` anywhere in the
output. The inputs, made in a scratch folder from a tiny real run (2 steps of resnet20 on
synthetic data, a checkpoint per step), shards packed from a few PNG files, and a copy of
Fashion-MNIST:
  1. a shard index whose record offset + length wraps past 2^64, and a 48-byte index claiming
     2^61+1 records (`data verify` and `train --data shards:DIR`);
  2. --threads / --workers far beyond the machine (train, eval) and `eval --workers 0`;
  3. --steps / --epochs 2^63-1 (more than the step and sample counters hold);
  4. checkpoints edited with h5py (`ckpt verify`, `eval --ckpt`, `train --resume auto`):
     global_step -5, a model tensor or a momentum tensor deleted, an unknown model
     (resnet600000002: refused in seconds, without gigabytes), a tensor declaring 10^12
     elements, an external link, external raw storage, epoch -1, a run config whose "data" is a
     number; `--resume auto` skips a bad newest checkpoint and resumes from the last good one;
  5. `ckpt verify` of a FIFO (refused at once, not read);
  6. metrics lines that are valid JSON of the wrong types (`report` skips them);
  7. a stop reason holding `<!--<script>` and `</script>`: the report page embeds it escaped;
  8. a Fashion-MNIST folder whose test images are 14x14;
  9. --model resnet600000002 (refused in seconds);
 11. a Fashion-MNIST folder under a path that is not UTF-8: it trains (not refused), and its
     records name the folder with U+FFFD (a JSON library error before);
 10. a seeded fuzz (random.Random(1234), 40 mutations): byte flips and cuts of a checkpoint
     (`ckpt verify`, `eval`), a shard index (`data verify`, `train`), an IDX label file (`train`)
     and a metrics file (`report`): exit 0 (a harmless mutation) or one `error:` line, never a
     crash or a hang; a truncated checkpoint, index or label file must be refused.
Case 4 needs h5py, case 8 and the IDX fuzz /usr/share/datasets/fashion-mnist: without them those
cases are skipped (the output says so) and the rest still run. One line per command is printed
(how it ended, its error line); each failure is printed at the end as `FAIL: ...`.

  tests/test_hostile_input.py SPOTRAIN_BINARY
"""
import gzip
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

try:
    import h5py
    import numpy as np
except ImportError as e:
    h5py = None
    H5PY_MISSING = str(e)

FASHION = "/usr/share/datasets/fashion-mnist"
FASHION_FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
CRASH_TEXT = ("terminate called", "Segmentation", "json.exception", "vector::", "bad_alloc")
TIMEOUT = 60  # seconds a command may take before it counts as a hang
HUGE = "9223372036854775807"  # 2^63 - 1

SPOTRAIN = None
SCRATCH = None
failures = []
_scratch_count = [0]

# The tiny real run, and the other trainings below: one thread, tiny limits.
TINY = ["train", "--model", "resnet20", "--data", "synthetic", "--train-limit", "64",
        "--test-limit", "32", "--batch-size", "16", "--threads", "1", "--device", "cpu"]


def scratch(name):
    """A fresh path in the scratch folder (not created)."""
    _scratch_count[0] += 1
    return os.path.join(SCRATCH, "%s-%d" % (name, _scratch_count[0]))


# ---- running the CLI ----

class Result:
    def __init__(self, args, rc, out, err, seconds, rss_mib, hung, timeout):
        self.args, self.rc, self.out, self.err = args, rc, out, err
        self.seconds, self.rss_mib, self.hung, self.timeout = seconds, rss_mib, hung, timeout

    @property
    def error_lines(self):
        return [l for l in self.err.splitlines() if l.startswith("error:")]

    def describe(self):
        """The command and what it printed, for a failure message."""
        shown = self.error_lines or (self.err + self.out).strip().splitlines()[-6:]
        status = "hung" if self.hung else "exit %d" % self.rc
        return ("\n    $ spotrain %s\n    %s after %.1f s, max RSS %.0f MiB\n" %
                (" ".join(self.args), status, self.seconds, self.rss_mib) +
                "".join("    | %s\n" % l[:400] for l in shown)).rstrip("\n")


def run(args, timeout=TIMEOUT):
    """Runs spotrain ARGS in the scratch folder; a run past `timeout` is killed (a hang).
    Memory is the child's own peak RSS (wait4)."""
    args = [str(a) for a in args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        p = subprocess.Popen([SPOTRAIN] + args, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             cwd=SCRATCH, env=env, start_new_session=True)
        hung = threading.Event()

        def kill():
            hung.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Result(args, p.returncode, out.read().decode("utf-8", "replace"),
                      err.read().decode("utf-8", "replace"), seconds, usage.ru_maxrss / 1024.0,
                      hung.is_set(), timeout)


def crash_signs(r):
    """What no run may do: hang, die of a signal, print a crash or an uncaught exception."""
    signs = []
    if r.hung:
        signs.append("hung (killed after %d s)" % r.timeout)
    elif r.rc < 0:
        signs.append("killed by signal %d" % -r.rc)
    elif r.rc >= 128:
        signs.append("exit code %d (a signal)" % r.rc)
    for text in CRASH_TEXT:
        if text in r.out or text in r.err:
            signs.append("printed '%s'" % text)
    return signs


def fail(what, problems, r=None):
    failures.append("%s: %s%s" % (what, "; ".join(problems), r.describe() if r else ""))


def log(what, r, problems):
    """One line per command: what it was, how it ended, its error line."""
    status = "hung" if r.hung else "exit %d" % r.rc
    line = (r.error_lines or [""])[0]
    print("  %-4s %-8s %5.1f s  %s%s" % ("FAIL" if problems else "ok", status, r.seconds, what,
                                         (": " + line[:200]) if line else ""))


def expect_error(what, args, mentions=(), details=(), within=None, most_mib=None, timeout=TIMEOUT,
                 in_error=()):
    """A refusal: exit 1 or 2, one `error:` line, the last of stderr (what a log's tail shows),
    mentioning one of `mentions` and each of `in_error` (case-insensitive), stderr mentioning
    each of `details`, no crash; optionally within `within` seconds and `most_mib` MiB of
    memory."""
    r = run(args, timeout)
    problems = crash_signs(r)
    if not r.hung:
        if r.rc == 0:
            problems.append("exited 0 (accepted it)")
        elif r.rc not in (1, 2) and not problems:
            problems.append("exit code %d, not 1 or 2" % r.rc)
        errors = r.error_lines
        if len(errors) != 1:
            problems.append("%d `error:` lines on stderr, not 1" % len(errors))
        elif mentions and not any(m.lower() in errors[0].lower() for m in mentions):
            problems.append("its error line mentions none of %s" % ", ".join(repr(m) for m in mentions))
        if len(errors) == 1:
            last = ([l for l in r.err.splitlines() if l.strip()] or [""])[-1]
            if last != errors[0]:
                problems.append("the last line of stderr is not the error line but %r" % last[:200])
            for d in in_error:
                if d.lower() not in errors[0].lower():
                    problems.append("its error line does not say %r (the first problem)" % d)
        for d in details:
            if d.lower() not in r.err.lower():
                problems.append("stderr does not mention %r" % d)
        if within is not None and r.seconds > within:
            problems.append("took %.1f s, more than %d s" % (r.seconds, within))
        if most_mib is not None and r.rss_mib > most_mib:
            problems.append("used %.0f MiB, more than %d MiB" % (r.rss_mib, most_mib))
    log(what, r, problems)
    if problems:
        fail(what, problems, r)
    return r


def expect_success(what, args, timeout=TIMEOUT):
    r = run(args, timeout)
    problems = crash_signs(r)
    if not r.hung and r.rc != 0 and not problems:
        problems.append("exit code %d, expected 0" % r.rc)
    log(what, r, problems)
    if problems:
        fail(what, problems, r)
    return r


def expect_no_crash(what, args, must_refuse=False):
    """A fuzzed input: exit 0 (when the mutation did no harm) or a refusal with one `error:`
    line; with `must_refuse`, only a refusal."""
    r = run(args)
    problems = crash_signs(r)
    if not r.hung and not problems:
        if r.rc not in (0, 1, 2):
            problems.append("exit code %d, not 0, 1 or 2" % r.rc)
        elif r.rc == 0 and must_refuse:
            problems.append("exited 0 (accepted it)")
        elif r.rc != 0 and len(r.error_lines) != 1:
            problems.append("%d `error:` lines on stderr, not 1" % len(r.error_lines))
    log(what, r, problems)
    if problems:
        fail(what, problems, r)
    return r


# ---- inputs ----

def make_run(d):
    """The tiny real run: ckpt-00000001.h5, ckpt-00000002.h5, latest, metrics.jsonl."""
    run_dir = os.path.join(d, "run")
    expect_success("the tiny real run", TINY + ["--steps", "2", "--ckpt-dir", run_dir, "--ckpt-every", "1",
                                                "--metrics", os.path.join(run_dir, "metrics.jsonl")])
    for f in ("ckpt-00000001.h5", "ckpt-00000002.h5", "latest", "metrics.jsonl"):
        if not os.path.isfile(os.path.join(run_dir, f)):
            failures.append("the tiny real run left no %s in %s" % (f, run_dir))
            return None
    return run_dir


def png(width, height, rgb):
    """An 8-bit RGB PNG of `rgb` (height rows of width*3 bytes)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    rows = b"".join(b"\0" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def make_shards(d):
    """Shards packed by `spotrain data pack` from 16x16 PNGs: train/ and val/, 2 classes x 3."""
    src, out = os.path.join(d, "images"), os.path.join(d, "shards")
    rng = random.Random(7)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            os.makedirs(os.path.join(src, split, cls))
            for i in range(3):
                with open(os.path.join(src, split, cls, "%d.png" % i), "wb") as f:
                    f.write(png(16, 16, bytes(rng.randrange(256) for _ in range(16 * 16 * 3))))
    packed = expect_success("data pack of a folder of PNG files", ["data", "pack", src, out])
    if packed.rc != 0 or not os.path.isfile(os.path.join(out, "train", "index.bin")):
        return None
    if expect_success("data verify of freshly packed shards", ["data", "verify", out]).rc != 0:
        return None
    if expect_success("training on freshly packed shards", shards_train(out)).rc != 0:
        return None
    return out


def one_step(data, run, *more):
    """`train` for one step of resnet20 on `data` on the CPU, its run folder `run` in the scratch."""
    return ["train", "--model", "resnet20", "--data", data, "--steps", "1", "--threads", "1",
            "--device", "cpu", "--ckpt-dir", scratch(run)] + list(more)


def shards_train(shards):
    return one_step("shards:" + shards, "shards-run", "--image-size", "16", "--batch-size", "2", "--test-limit", "2")


def read_index(path):
    """index.bin: "SPOTIDX1" u64 count u32 shards u32 classes, then per record
    u32 shard u32 length u64 offset i32 label u32 crc32 (little-endian)."""
    raw = open(path, "rb").read()
    _, count, shards, classes = struct.unpack_from("<8sQII", raw)
    return shards, classes, [list(struct.unpack_from("<IIQiI", raw, 24 + 24 * i)) for i in range(count)]


def write_index(path, count, shards, classes, entries):
    with open(path, "wb") as f:
        f.write(struct.pack("<8sQII", b"SPOTIDX1", count, shards, classes))
        for e in entries:
            f.write(struct.pack("<IIQiI", *e))


def fashion_copy(folder):
    """A Fashion-MNIST folder: links to the four original files (replace one to change it)."""
    os.makedirs(folder)
    for f in FASHION_FILES:
        os.symlink(os.path.join(FASHION, f), os.path.join(folder, f))
    return folder


def fashion_train(folder):
    return one_step("fashion-mnist:" + folder, "fashion-run", "--train-limit", "64", "--test-limit", "32",
                    "--batch-size", "16")


def records(metrics_path):
    out = []
    for line in open(metrics_path, encoding="utf-8", errors="replace"):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


# ---- 1. shard indexes ----

def case_shard_offset_that_wraps_past_2_64_is_refused(shards):
    bad = scratch("shards-wrap")
    shutil.copytree(shards, bad)
    index = os.path.join(bad, "train", "index.bin")
    n_shards, classes, entries = read_index(index)
    entries[0][1] = 16             # length
    entries[0][2] = 2 ** 64 - 8    # offset: offset + length wraps to 8
    write_index(index, len(entries), n_shards, classes, entries)
    expect_error("data verify, a record whose offset + length wraps past 2^64", ["data", "verify", bad],
                 mentions=[bad], in_error=["outside"])
    expect_error("train --data shards:, a record whose offset + length wraps past 2^64", shards_train(bad),
                 mentions=["outside"])


def case_shard_index_of_48_bytes_claiming_2_61_records_is_refused(shards):
    bad = scratch("shards-count")
    shutil.copytree(shards, bad)
    index = os.path.join(bad, "train", "index.bin")
    n_shards, classes, entries = read_index(index)
    write_index(index, 2 ** 61 + 1, n_shards, classes, entries[:1])  # 24 * (2^61+1) wraps to 24
    assert os.path.getsize(index) == 48
    expect_error("data verify, a 48-byte index.bin claiming 2^61+1 records", ["data", "verify", bad],
                 mentions=[bad], in_error=["index"])
    expect_error("train --data shards:, a 48-byte index.bin claiming 2^61+1 records", shards_train(bad),
                 mentions=["index"])


def case_shard_indexes_that_wrap_are_refused(shards):
    if shards is None:
        print("skipped: the shard-index cases (1) need shards packed by `spotrain data pack`")
        return
    case_shard_offset_that_wraps_past_2_64_is_refused(shards)
    case_shard_index_of_48_bytes_claiming_2_61_records_is_refused(shards)


# ---- 2. and 3. flags ----

def case_thread_and_worker_counts_beyond_the_machine_are_refused(ckpt):
    expect_error("train --threads 100000", TINY[:-4] + ["--threads", "100000", "--device", "cpu", "--steps", "1",
                                                        "--ckpt-dir", scratch("threads")],
                 mentions=["--threads"])
    expect_error("train --workers 100000", TINY + ["--workers", "100000", "--steps", "1",
                                                   "--ckpt-dir", scratch("workers")],
                 mentions=["--workers"])
    eval_args = ["eval", "--ckpt", ckpt, "--data", "synthetic", "--test-limit", "16", "--batch-size", "16",
                 "--device", "cpu"]
    expect_error("eval --workers 100000", eval_args + ["--threads", "1", "--workers", "100000"],
                 mentions=["--workers"])
    expect_error("eval --workers 0", eval_args + ["--threads", "1", "--workers", "0"], mentions=["--workers"])
    expect_error("eval --threads 100000", eval_args + ["--threads", "100000"], mentions=["--threads"])


def case_step_counts_beyond_the_counters_are_refused():
    expect_error("train --steps 2^63-1", TINY + ["--steps", HUGE, "--ckpt-dir", scratch("steps")],
                 mentions=["counters"])
    expect_error("train --epochs 2^63-1", TINY + ["--epochs", HUGE, "--ckpt-dir", scratch("epochs")],
                 mentions=["counters"])


# ---- 4. checkpoints edited with h5py ----

def crafted(src, dst, edit):
    """A copy of checkpoint `src` at `dst`, edited in place by edit(h5py.File)."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)
    return dst


def model_tensor(f):
    return "fc.weight" if "fc.weight" in f["model"] else sorted(f["model"])[0]


def set_string_attr(f, name, value):
    """A fixed-length string, as the engine writes them."""
    f.attrs.create(name, np.bytes_(value.encode()))


def attr_text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def resume_auto(what, run_dir, expect_step, expect_file, skipped_file):
    """`train --resume auto` in a copy of the run folder: exit 0, resumed from `expect_file` at
    `expect_step`, and said it skipped `skipped_file`."""
    r = expect_success(what, TINY + ["--steps", "3", "--ckpt-dir", run_dir, "--ckpt-every", "1",
                                     "--resume", "auto"])
    if r.rc != 0:
        return
    problems = []
    said = r.out + r.err
    if "skipping" not in said or skipped_file not in said:
        problems.append("it did not say it skipped %s" % skipped_file)
    resumes = [j for j in records(os.path.join(run_dir, "metrics.jsonl"))
               if isinstance(j, dict) and j.get("type") == "resume"]
    if not resumes:
        problems.append("it wrote no resume record")
    else:
        last = resumes[-1]
        if last.get("step") != expect_step or not str(last.get("checkpoint", "")).endswith(expect_file):
            problems.append("it resumed at step %r from %r, not at step %d from %s" %
                            (last.get("step"), last.get("checkpoint"), expect_step, expect_file))
    if problems:
        fail(what, problems, r)


def case_crafted_checkpoints_are_refused(run_dir):
    if h5py is None:
        print("skipped: the crafted-checkpoint cases (4) need h5py and numpy (%s)" % H5PY_MISSING)
        return
    good = os.path.join(run_dir, "ckpt-00000002.h5")
    d = scratch("crafted")
    os.makedirs(d)
    with h5py.File(good, "r") as f:
        tensor = model_tensor(f)
        momentum = sorted(f["optimizer/momentum"])[0]

    def verify(what, path, mentions, **kw):
        expect_error("ckpt verify, " + what, ["ckpt", "verify", path], mentions=mentions, **kw)

    def evaluate(what, path, mentions, data=True, **kw):
        expect_error("eval --ckpt, " + what,
                     ["eval", "--ckpt", path, "--test-limit", "16", "--batch-size", "16", "--threads", "1",
                      "--device", "cpu"] + (["--data", "synthetic"] if data else []),
                     mentions=mentions, **kw)

    # (a) global_step -5: refused, and --resume auto passes over it as the newest file.
    path = crafted(good, os.path.join(d, "negative-step.h5"), lambda f: f.attrs.modify("global_step", -5))
    verify("global_step -5", path, ["global_step"])
    copy = scratch("resume-negative-step")
    shutil.copytree(run_dir, copy)
    shutil.copyfile(path, os.path.join(copy, "ckpt-00000003.h5"))
    resume_auto("train --resume auto past a newest checkpoint with global_step -5", copy, 2,
                "ckpt-00000002.h5", "ckpt-00000003.h5")

    # (b) a model tensor deleted: refused, and --resume auto falls back to the older file.
    path = crafted(good, os.path.join(d, "no-model-tensor.h5"), lambda f: f.__delitem__("model/" + tensor))
    verify("model/%s deleted" % tensor, path, [tensor])
    copy = scratch("resume-no-model-tensor")
    shutil.copytree(run_dir, copy)
    shutil.copyfile(path, os.path.join(copy, "ckpt-00000002.h5"))
    resume_auto("train --resume auto past a newest checkpoint without model/" + tensor, copy, 1,
                "ckpt-00000001.h5", "ckpt-00000002.h5")

    # (c) a momentum tensor deleted.
    path = crafted(good, os.path.join(d, "no-momentum-tensor.h5"),
                   lambda f: f.__delitem__("optimizer/momentum/" + momentum))
    verify("optimizer/momentum/%s deleted" % momentum, path, [momentum])

    # (d) a model no one can build: refused by name, at once, without gigabytes, naming the
    # file and that the name came from it (the user typed no --model).
    path = crafted(good, os.path.join(d, "unknown-model.h5"), lambda f: set_string_attr(f, "model", "resnet600000002"))
    verify("model resnet600000002", path, [path], within=10, most_mib=1024,
           in_error=["resnet600000002", "records"])
    evaluate("model resnet600000002", path, [path], within=10, most_mib=1024,
             in_error=["resnet600000002", "records"])

    # (e) a tensor declaring 10^12 elements (chunked, never written: the file stays small).
    def huge(f):
        name = "model/" + tensor
        crc = int(f[name].attrs["crc32"])
        del f[name]
        ds = f.create_dataset(name, shape=(10 ** 12,), dtype="<f4", chunks=(4096,), fillvalue=0.0)
        ds.attrs["crc32"] = np.int64(crc)
    path = crafted(good, os.path.join(d, "huge-tensor.h5"), huge)
    verify("a tensor declaring 10^12 elements", path, [tensor], most_mib=1024)
    evaluate("a tensor declaring 10^12 elements", path, [tensor], most_mib=1024)

    # (f) an external link to another file holding the same tensor.
    other = os.path.join(d, "other.h5")

    def external_link(f):
        name = "model/" + tensor
        data, crc = f[name][...], int(f[name].attrs["crc32"])
        with h5py.File(other, "w") as o:
            o["x"] = data
            o["x"].attrs["crc32"] = np.int64(crc)
        del f[name]
        f[name] = h5py.ExternalLink("other.h5", "/x")
    path = crafted(good, os.path.join(d, "external-link.h5"), external_link)
    verify("an external link", path, ["external", "self-contained"])
    evaluate("an external link", path, ["external", "self-contained"])

    # (g) a tensor whose bytes are kept in another file (external raw storage).
    raw = os.path.join(d, "tensor.raw")

    def external_storage(f):
        name = "model/" + tensor
        data, crc = f[name][...].astype("<f4"), int(f[name].attrs["crc32"])
        data.tofile(raw)
        del f[name]
        ds = f.create_dataset(name, shape=data.shape, dtype="<f4", external=[(raw, 0, h5py.h5f.UNLIMITED)])
        ds.attrs["crc32"] = np.int64(crc)
    path = crafted(good, os.path.join(d, "external-storage.h5"), external_storage)
    verify("external raw storage", path, ["another file", "self-contained"])
    evaluate("external raw storage", path, ["another file", "self-contained"])

    # (h) epoch -1.
    path = crafted(good, os.path.join(d, "negative-epoch.h5"), lambda f: f.attrs.modify("epoch", -1))
    verify("epoch -1", path, ["epoch"])

    # (h2) epoch written as a string by another tool: the file and the attribute, not HDF5's stack.
    def string_epoch(f):
        del f.attrs["epoch"]
        f.attrs["epoch"] = "seven"
    path = crafted(good, os.path.join(d, "string-epoch.h5"), string_epoch)
    verify("epoch as a string", path, [path], in_error=["'epoch'", "string"])

    # (i) a run config whose "data" is a number: eval without --data cannot take it from there.
    def numeric_data(f):
        cfg = json.loads(attr_text(f.attrs["config"]))
        cfg["data"] = 123
        set_string_attr(f, "config", json.dumps(cfg))
    path = crafted(good, os.path.join(d, "numeric-data.h5"), numeric_data)
    evaluate('a run config with "data": 123 (no --data)', path, ["--data"], data=False, in_error=[path])

    # (j) a run config whose data set is gone: eval without --data says the value came from the file.
    def gone_data(f):
        cfg = json.loads(attr_text(f.attrs["config"]))
        cfg["data"] = "imagefolder:/nonexistent/spotrain-data"
        set_string_attr(f, "config", json.dumps(cfg))
    path = crafted(good, os.path.join(d, "gone-data.h5"), gone_data)
    evaluate("a run config whose data folder is gone (no --data)", path, [path], data=False,
             in_error=["recorded in checkpoint", "/nonexistent/spotrain-data"])


# ---- 5. a FIFO ----

def case_checkpoint_that_is_a_fifo_is_refused_at_once():
    fifo = scratch("fifo") + ".h5"
    os.mkfifo(fifo)
    expect_error("ckpt verify of a FIFO", ["ckpt", "verify", fifo], mentions=["regular file"], within=5, timeout=15)
    expect_error("eval --ckpt of a FIFO", ["eval", "--ckpt", fifo, "--data", "synthetic", "--threads", "1",
                                           "--device", "cpu"],
                 mentions=["regular file"], within=5, timeout=15)


# ---- 6. and 7. the report ----

def report_folder(run_dir, extra_lines):
    """A run folder holding the real metrics.jsonl with `extra_lines` appended."""
    folder = scratch("report")
    os.makedirs(folder)
    shutil.copyfile(os.path.join(run_dir, "metrics.jsonl"), os.path.join(folder, "metrics.jsonl"))
    with open(os.path.join(folder, "metrics.jsonl"), "a") as f:
        for line in extra_lines:
            f.write(line + "\n")
    return folder


def case_report_skips_metrics_lines_of_the_wrong_types(run_dir):
    t = "2026-01-01T00:00:00.000Z"
    wrong = ['{"type":"step","step":"ten","time":"%s","elapsed":1.0,"loss":0.5}' % t,
             '{"type":5}',
             '{"type":"step","time":5}']
    r = expect_success("report of metrics with lines of the wrong types",
                       ["report", report_folder(run_dir, wrong)])
    if r.rc == 0 and "skipped 3 line" not in r.out + r.err:
        fail("report of metrics with lines of the wrong types", ["it did not say it skipped 3 lines"], r)
    # The fields the page reads from the start record (backend, ranks, precision), wrongly typed.
    start = json.dumps({"type": "start", "time": t, "elapsed": 0.0, "backend": 5, "ranks": "two",
                        "precision": [1], "config": "none"})
    expect_success("report of metrics whose last start record has wrongly typed fields",
                   ["report", report_folder(run_dir, [start])])


def case_resume_skips_metrics_lines_of_the_wrong_types(run_dir):
    """A metrics file whose last line has the right keys with the wrong types (another tool
    appended it): a resume reads the previous process's last record from it, and must skip the
    line, not end with a JSON type error that names no file."""
    copy = scratch("resume-metrics-types")
    shutil.copytree(run_dir, copy)
    with open(os.path.join(copy, "metrics.jsonl"), "a") as f:
        f.write('{"type":"stop","time":"2026-01-01T00:00:00.000Z","elapsed":1.0,"step":"two","reason":5}\n')
    expect_success("train --resume auto after a metrics line of the wrong types",
                   TINY + ["--steps", "3", "--ckpt-dir", copy, "--resume", "auto"])


def case_report_escapes_script_tags_in_the_data(run_dir):
    reason = "MARK1<!--<script>alert(1)</script><b>MARK2 & more"
    stop = json.dumps({"type": "stop", "time": "2026-01-01T00:00:00.000Z", "elapsed": 1.0, "step": 2,
                       "reason": reason, "checkpoint": "ckpt-00000002.h5"})
    folder = report_folder(run_dir, [stop])
    page = os.path.join(folder, "page.html")
    r = expect_success("report of a stop reason holding <!--<script> and </script>",
                       ["report", folder, "-o", page])
    if r.rc != 0:
        return
    html = open(page, encoding="utf-8", errors="replace").read()
    problems = []
    for raw in ("<!--<script>", "</script><", "MARK1<!--", "</script><b>MARK2"):
        if raw in html:
            problems.append("the page holds %r unescaped" % raw)
    marker = "const REPORT = "
    at = html.find(marker)
    if at < 0:
        problems.append("the page has no %r" % marker)
    else:
        data_text = html[at + len(marker):html.find("\n", at)]
        if "<" in data_text:
            problems.append("the embedded data holds a '<'")
        if "\\u003c!--\\u003cscript\\u003e" not in data_text:
            problems.append("the embedded data does not hold the reason as \\u003c!--\\u003cscript\\u003e")
        try:
            data, _ = json.JSONDecoder().raw_decode(data_text)
            if reason not in json.dumps(data, ensure_ascii=False):
                problems.append("the embedded data does not decode to the stop reason")
        except ValueError as e:
            problems.append("the embedded data is not JSON (%s)" % e)
        if html.count("</script", at) != 1:
            problems.append("%d '</script' after the data, not the page's own 1" % html.count("</script", at))
    if problems:
        fail("report of a stop reason holding <!--<script> and </script>", problems, r)


# ---- 8. and 9. data and model ----

def case_test_images_of_another_size_are_refused():
    if not all(os.path.isfile(os.path.join(FASHION, f)) for f in FASHION_FILES):
        print("skipped: the 14x14 test-images case (8) needs %s" % FASHION)
        return
    folder = fashion_copy(scratch("fashion-14x14"))
    test_images = os.path.join(folder, "t10k-images-idx3-ubyte.gz")
    os.unlink(test_images)
    count = 10000  # as many as the test labels
    with gzip.open(test_images, "wb", compresslevel=1) as f:
        f.write(struct.pack(">IIII", 0x00000803, count, 14, 14))
        f.write(bytes(range(196)) * count)
    expect_error("train on Fashion-MNIST whose test images are 14x14", fashion_train(folder),
                 mentions=["14x14", "size"])


def case_a_data_folder_under_a_non_utf8_path_trains():
    """Not hostile, only unusual: a folder name that is not UTF-8 (bytes 0xff here) is a valid
    path; the run trains, and the records name it with U+FFFD instead of failing to write JSON."""
    if not all(os.path.isfile(os.path.join(FASHION, f)) for f in FASHION_FILES):
        print("skipped: the non-UTF-8 path case (11) needs %s" % FASHION)
        return
    folder = fashion_copy(scratch("fashion-") + "\udcff\udcfe")  # bytes ff fe on disk
    args = fashion_train(folder)
    r = expect_success("train on Fashion-MNIST under a non-UTF-8 path", args)
    metrics = os.path.join(args[args.index("--ckpt-dir") + 1], "metrics.jsonl")
    if r.rc == 0 and not any(rec.get("type") == "start" and "\ufffd" in json.dumps(rec, ensure_ascii=False)
                             for rec in records(metrics)):
        fail("train under a non-UTF-8 path", ["its start record does not name the folder with U+FFFD"], r)


def case_unknown_model_is_refused_at_once():
    expect_error("train --model resnet600000002",
                 ["train", "--model", "resnet600000002"] + TINY[3:] + ["--steps", "1", "--ckpt-dir", scratch("model")],
                 mentions=["unknown model"], within=10, most_mib=1024)


# ---- 10. a seeded fuzz ----

def flipped(rng, data, flips, within=None):
    b = bytearray(data)
    where = []
    for _ in range(flips):
        i = rng.randrange(min(within or len(b), len(b)))
        b[i] ^= rng.randrange(1, 256)
        where.append(i)
    return bytes(b), "bytes %s flipped" % ",".join(map(str, sorted(where)))


def cut(rng, data):
    at = rng.randrange(len(data))
    return data[:at], "cut at byte %d of %d" % (at, len(data))


def fuzz_checkpoints(rng, run_dir, n):
    """A checkpoint with bytes flipped (half in its first 16 KiB: the superblock, the root
    group's attributes) or cut short, through `ckpt verify` and `eval --ckpt`."""
    original = open(os.path.join(run_dir, "ckpt-00000002.h5"), "rb").read()
    for k in range(n):
        kind = ("head", "anywhere", "cut")[k % 3]
        if kind == "cut":
            data, how = cut(rng, original)
        else:
            data, how = flipped(rng, original, rng.randint(1, 8), 16384 if kind == "head" else None)
        path = scratch("fuzz-ckpt") + ".h5"
        open(path, "wb").write(data)
        what = "fuzz %d: checkpoint with %s" % (k, how)
        expect_no_crash("ckpt verify, " + what, ["ckpt", "verify", path], must_refuse=kind == "cut")
        expect_no_crash("eval --ckpt, " + what,
                        ["eval", "--ckpt", path, "--data", "synthetic", "--test-limit", "16", "--batch-size", "16",
                         "--threads", "1", "--device", "cpu"], must_refuse=kind == "cut")


def fuzz_shard_index(rng, shards, n):
    index = open(os.path.join(shards, "train", "index.bin"), "rb").read()
    for k in range(n):
        if k % 4 == 3:
            data, how = cut(rng, index)
        else:
            data, how = flipped(rng, index, rng.randint(1, 3))
        bad = scratch("fuzz-shards")
        shutil.copytree(shards, bad)
        open(os.path.join(bad, "train", "index.bin"), "wb").write(data)
        what = "fuzz %d: shard index with %s" % (k, how)
        expect_no_crash("data verify, " + what, ["data", "verify", bad], must_refuse=k % 4 == 3)
        expect_no_crash("train --data shards:, " + what, shards_train(bad), must_refuse=k % 4 == 3)


def fuzz_idx_labels(rng, n):
    """The test labels (IDX1, gzipped) with bytes flipped (half in the 8-byte header), cut
    short, or the gzip stream itself damaged, through `train --steps 1`."""
    raw = gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"), "rb").read()
    for k in range(n):
        kind = ("header", "anywhere", "cut", "gzip")[k % 4]
        if kind == "header":
            data, how = flipped(rng, raw, rng.randint(1, 2), 8)
        elif kind == "anywhere":
            data, how = flipped(rng, raw, rng.randint(1, 4))
        elif kind == "cut":
            data, how = cut(rng, raw)
        if kind == "gzip":
            packed, how = flipped(rng, gzip.compress(raw), rng.randint(1, 3))
            how = "gzip stream " + how
        else:
            packed = gzip.compress(data, compresslevel=1)
        folder = fashion_copy(scratch("fuzz-labels"))
        labels = os.path.join(folder, "t10k-labels-idx1-ubyte.gz")
        os.unlink(labels)
        open(labels, "wb").write(packed)
        expect_no_crash("train, fuzz %d: test labels with %s" % (k, how), fashion_train(folder),
                        must_refuse=kind == "cut")


def fuzz_metrics(rng, run_dir, n):
    """metrics.jsonl with bytes flipped, one line cut short, or the file cut, through `report`."""
    original = open(os.path.join(run_dir, "metrics.jsonl"), "rb").read()
    for k in range(n):
        kind = ("flip", "line", "cut")[k % 3]
        if kind == "flip":
            data, how = flipped(rng, original, rng.randint(1, 10))
        elif kind == "line":
            lines = original.split(b"\n")
            i = rng.randrange(len(lines))
            at = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at]
            data, how = b"\n".join(lines), "line %d cut at byte %d" % (i, at)
        else:
            data, how = cut(rng, original)
        folder = scratch("fuzz-metrics")
        os.makedirs(folder)
        open(os.path.join(folder, "metrics.jsonl"), "wb").write(data)
        expect_no_crash("report, fuzz %d: metrics with %s" % (k, how),
                        ["report", folder, "-o", os.path.join(folder, "page.html")])


def case_seeded_fuzz(run_dir, shards):
    rng = random.Random(1234)
    fuzz_checkpoints(rng, run_dir, 16)
    if shards:
        fuzz_shard_index(rng, shards, 8)
    if all(os.path.isfile(os.path.join(FASHION, f)) for f in FASHION_FILES):
        fuzz_idx_labels(rng, 8)
    else:
        print("skipped: the IDX label fuzz needs %s" % FASHION)
    fuzz_metrics(rng, run_dir, 8)


def main():
    global SPOTRAIN, SCRATCH
    SPOTRAIN = os.path.abspath(sys.argv[1])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spotrain-hostile-") as d:
        SCRATCH = d
        run_dir = make_run(d)
        shards = make_shards(d)
        if run_dir is None:
            for f in failures:
                print("FAIL: " + f)
            return 1
        steps = [
            ("1. shard indexes", lambda: case_shard_indexes_that_wrap_are_refused(shards)),
            ("2. thread and worker counts",
             lambda: case_thread_and_worker_counts_beyond_the_machine_are_refused(
                 os.path.join(run_dir, "ckpt-00000002.h5"))),
            ("3. step counts", case_step_counts_beyond_the_counters_are_refused),
            ("4. crafted checkpoints", lambda: case_crafted_checkpoints_are_refused(run_dir)),
            ("5. a FIFO", case_checkpoint_that_is_a_fifo_is_refused_at_once),
            ("6. metrics of the wrong types", lambda: case_report_skips_metrics_lines_of_the_wrong_types(run_dir)),
            ("6b. a resume after metrics of the wrong types",
             lambda: case_resume_skips_metrics_lines_of_the_wrong_types(run_dir)),
            ("7. report escaping", lambda: case_report_escapes_script_tags_in_the_data(run_dir)),
            ("8. 14x14 test images", case_test_images_of_another_size_are_refused),
            ("9. unknown model", case_unknown_model_is_refused_at_once),
            ("10. seeded fuzz", lambda: case_seeded_fuzz(run_dir, shards)),
            ("11. a non-UTF-8 data path", case_a_data_folder_under_a_non_utf8_path_trains),
        ]
        for name, step in steps:
            before, t0 = len(failures), time.monotonic()
            step()
            print("%-32s %s (%.0f s)" % (name, "ok" if len(failures) == before else
                                         "%d failure(s)" % (len(failures) - before), time.monotonic() - t0))
    print("%.0f s in all" % (time.monotonic() - started))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
