#!/usr/bin/python3
"""`spotrain data sort-val` (CTest, label unit): ImageNet's flat validation folder sorted into
class folders from each labels format (LOC_val_solution.csv, NAME CLASS lines, the devkit's
numbered ground truth with --synsets); --dry-run moves nothing; a second run finds everything
sorted; labels that do not fit the folder, or would climb out of it, are one error line and
move nothing. Usage: test_sort_val.py SPOTRAIN_BIN"""
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
WNIDS = ["n01440764", "n01443537", "n01484850"]
failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    r = subprocess.run([BIN, "data", "sort-val", *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    print(r.stdout)
    return r


def flat_folder(root, n=7):
    os.makedirs(root)
    names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, n + 1)]
    for i, name in enumerate(names):
        with open(os.path.join(root, name), "wb") as f:
            f.write(b"\xff\xd8 image %d" % i)
    return names


def layout(root):
    out = {}
    for d in sorted(os.listdir(root)):
        p = os.path.join(root, d)
        out[d] = sorted(os.listdir(p)) if os.path.isdir(p) else None
    return out


with tempfile.TemporaryDirectory() as t:
    # 1. LOC_val_solution.csv: a header, "ImageId,PredictionString" with the class first.
    val = os.path.join(t, "csv", "val")
    names = flat_folder(val)
    labels = os.path.join(t, "LOC_val_solution.csv")
    with open(labels, "w") as f:
        f.write("ImageId,PredictionString\n")
        for i, n in enumerate(names):
            f.write(f"{n[:-5]},{WNIDS[i % 3]} 10 20 30 40 {WNIDS[i % 3]} 1 2 3 4\n")
    before = layout(val)
    r = run(val, labels, "--dry-run")
    check(r.returncode == 0 and layout(val) == before, "--dry-run moves nothing")
    r = run(val, labels)
    check(r.returncode == 0 and "moved 7 image(s) into 3 class folder(s)" in r.stdout, "csv: 7 moved into 3 classes")
    want = {w: sorted(n for i, n in enumerate(names) if i % 3 == k) for k, w in enumerate(WNIDS)}
    check(layout(val) == want, "csv: every image in its class folder, none left flat")
    r = run(val, labels)
    check(r.returncode == 0 and "moved 0 image(s)" in r.stdout and "7 already sorted" in r.stdout,
          "a second run finds everything sorted")

    # 2. "NAME CLASS" lines (the valprep lists).
    val = os.path.join(t, "plain", "val")
    names = flat_folder(val, 4)
    labels = os.path.join(t, "plain.txt")
    with open(labels, "w") as f:
        f.writelines(f"{n} {WNIDS[i % 2]}\n" for i, n in enumerate(names))
    r = run(val, labels)
    check(r.returncode == 0 and layout(val) == {WNIDS[0]: [names[0], names[2]], WNIDS[1]: [names[1], names[3]]},
          "NAME CLASS lines")

    # 3. The devkit: class numbers in file-name order, names from --synsets.
    val = os.path.join(t, "devkit", "val")
    names = flat_folder(val, 5)
    truth, synsets = os.path.join(t, "ground_truth.txt"), os.path.join(t, "synsets.txt")
    with open(truth, "w") as f:
        f.write("3\n1\n3\n2\n1\n")
    with open(synsets, "w") as f:
        f.write("".join(w + " some words\n" for w in WNIDS))
    r = run(val, truth)
    check(r.returncode != 0 and "--synsets" in r.stdout and layout(val)[names[0]] is None,
          "numbered ground truth without --synsets: an error naming it, nothing moved")
    r = run(val, truth, "--synsets", synsets)
    check(r.returncode == 0 and layout(val) == {WNIDS[0]: [names[1], names[4]], WNIDS[1]: [names[3]],
                                                 WNIDS[2]: [names[0], names[2]]}, "devkit numbers with --synsets")

    # 4. Labels that do not fit: one error line, exit 1, nothing moved.
    val = os.path.join(t, "bad", "val")
    names = flat_folder(val, 3)
    before = layout(val)
    cases = {
        "count": ("1\n2\n", ["--synsets", synsets], "2 class numbers but"),
        "range": ("1\n2\n9\n", ["--synsets", synsets], "class number 9 is not in 1..3"),
        "climb": ("".join(f"{n} ../../escape\n" for n in names), [], "not a plain file and folder name"),
        "noclass": (names[0] + "\n", [], "names no class"),
        "missing": ("".join(f"{n} {WNIDS[0]}\n" for n in names + ["ILSVRC2012_val_00000099.JPEG"]), [],
                    "nor its class folders, the first: ILSVRC2012_val_00000099.JPEG"),
    }
    for name, (text, extra, why) in cases.items():
        p = os.path.join(t, name + ".txt")
        with open(p, "w") as f:
            f.write(text)
        r = run(val, p, *extra)
        lines = [l for l in r.stdout.splitlines() if l.startswith("error:")]
        moved_ok = layout(val) == before
        check(r.returncode == 1 and len(lines) == 1 and why in lines[0] and moved_ok,
              f"bad labels ({name}): one error line '{why}', nothing moved")
    check(not os.path.exists(os.path.join(t, "escape")), "nothing left the folder")
    r = run(os.path.join(t, "nowhere"), truth)
    check(r.returncode == 1 and "is not a folder" in r.stdout, "a missing folder is one error line")

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
