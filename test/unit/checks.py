"""The Python unit tests' assertion: expect() prints "ok" or "FAIL" and the behaviour, and
counts the failures; finish() prints the count and exits 1 if there was any."""
import sys

FAILURES = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def finish():
    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)
