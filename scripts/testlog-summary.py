#!/usr/bin/env python3
"""Counts meson's test log and prints one closing line: 'N passed, N failed, N skipped'.
A test that exits 77 is a skip (meson's convention); it must say why in its output."""
import json
import sys

passed = failed = skipped = unreadable = 0
try:
    with open(sys.argv[1]) as f:
        for line in f:
            try:
                r = json.loads(line).get("result", "")
            except json.JSONDecodeError:
                unreadable += 1  # a second meson test on the same build dir writes the same log
                continue
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:
                failed += 1
except FileNotFoundError:
    failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped"
      + (f" ({unreadable} unreadable log lines: another test run on this build?)" if unreadable else ""))
sys.exit(1 if failed or passed == 0 else 0)
