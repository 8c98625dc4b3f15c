"""The Python unit tests' assertion: expect() prints "ok" or "FAIL" and the behaviour (on a
failure also `detail`, e.g. the output of the command under test), and counts the failures;
finish() prints the count and exits 1 if there was any. run_python() runs a Python tool under
test and returns its exit status and output (stdout, then stderr)."""
import subprocess
import sys

FAILURES = []


def expect(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        if detail:
            print(detail)
        FAILURES.append(what)


def finish():
    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


def run_python(tool, *args):
    p = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr
