#!/usr/bin/env python3
"""scripts/gpu_test_report.py on the logs of a GPU run it was made for, written here as a GPU
machine would write them: two binaries, one whose shards all finished (a pass, a failure with
its message, a skip) and one whose second shard crashed (exit 139) in its first test, so that
the test it was running is "crashed (signal 11, SIGSEGV)" and the shard's later test "not run".
On 2026-12-04 such a crash hid four crashed and 26 never-run tests behind "29 passed, 11
failed, 2 skipped"."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu_test_report.py")


def write(d, name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


class GpuTestReport(unittest.TestCase):
    def test_counts_by_name_with_crashes_and_tests_that_never_ran(self):
        with tempfile.TemporaryDirectory() as d:
            # test_gpu_a: 3 tests, 1 shard, finished with a JSON report.
            write(d, "gpu-list-test_gpu_a.txt",
                  "Running main() from gtest_main.cc\nGpuA.\n  Passes\n  Fails\n  Skips\n")
            write(d, "gpu-test-test_gpu_a-0.log", "[ RUN      ] GpuA.Passes\n...\n")
            write(d, "gpu-test-test_gpu_a-0.rc", "1\n")
            write(d, "gpu-test-test_gpu_a-0.json", json.dumps({"testsuites": [{"name": "GpuA", "testsuite": [
                {"name": "Passes", "status": "RUN", "result": "COMPLETED"},
                {"name": "Fails", "status": "RUN", "result": "COMPLETED",
                 "failures": [{"failure": "tests/x.cpp:9\nExpected equality"}]},
                {"name": "Skips", "status": "RUN", "result": "SKIPPED"}]}]}))
            # test_gpu_b: 4 parameterized tests, 2 shards (0 and 2 in shard 0, 1 and 3 in shard 1).
            write(d, "gpu-list-test_gpu_b.txt",
                  "P/GpuB.\n  One/fp32  # GetParam() = fp32\n  Two/fp32  # GetParam() = fp32\n"
                  "  Three/fp32  # GetParam() = fp32\n  Four/fp32  # GetParam() = fp32\n")
            write(d, "gpu-test-test_gpu_b-0.log",
                  "[ RUN      ] P/GpuB.One/fp32\n[       OK ] P/GpuB.One/fp32 (3 ms)\n"
                  "[ RUN      ] P/GpuB.Three/fp32\n[       OK ] P/GpuB.Three/fp32 (2 ms)\n")
            write(d, "gpu-test-test_gpu_b-0.rc", "0\n")
            write(d, "gpu-test-test_gpu_b-0.json", json.dumps({"testsuites": [{"name": "P/GpuB", "testsuite": [
                {"name": "One/fp32", "status": "RUN", "result": "COMPLETED"},
                {"name": "Three/fp32", "status": "RUN", "result": "COMPLETED"}]}]}))
            write(d, "gpu-test-test_gpu_b-1.log",
                  "Note: This is test shard 2 of 2.\n[ RUN      ] P/GpuB.Two/fp32\n")
            write(d, "gpu-test-test_gpu_b-1.rc", "139\n")
            out = subprocess.run([sys.executable, SCRIPT, d, "--json", os.path.join(d, "r.json")],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
            lines = out.stdout.splitlines()
            # The status line last (a log's tail), with the first problem: the crash.
            self.assertEqual(lines[-1], "FAILED: 3 passed, 1 failed, 1 skipped, 1 crashed, 1 not run; "
                                        "first crashed: P/GpuB.Two/fp32 (signal 11, SIGSEGV)")
            self.assertIn("  failed: GpuA.Fails (tests/x.cpp:9)", lines)
            self.assertIn("  crashed: P/GpuB.Two/fp32 (signal 11, SIGSEGV)", lines)
            self.assertIn("  not run: P/GpuB.Four/fp32 (its shard crashed in P/GpuB.Two/fp32)", lines)
            r = json.load(open(os.path.join(d, "r.json")))
            self.assertEqual(r["counts"]["crashed"], 1)
            self.assertEqual(len(r["problems"]), 3)

    def test_all_passed_is_ok(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "gpu-list-test_gpu_a.txt", "GpuA.\n  Passes\n")
            write(d, "gpu-test-test_gpu_a-0.log", "[ RUN      ] GpuA.Passes\n[       OK ] GpuA.Passes (1 ms)\n")
            write(d, "gpu-test-test_gpu_a-0.rc", "0\n")
            out = subprocess.run([sys.executable, SCRIPT, d], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stdout)
            self.assertEqual(out.stdout.splitlines(), ["ok: 1 passed, 0 failed, 0 skipped"])

    def test_nothing_listed_is_a_failure(self):
        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([sys.executable, SCRIPT, d], capture_output=True, text=True)
            self.assertEqual(out.returncode, 1)
            self.assertEqual(out.stdout.splitlines()[-1], "FAILED: no gpu test listed")


if __name__ == "__main__":
    unittest.main()
