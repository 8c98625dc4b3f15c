#!/usr/bin/env python3
"""scripts/param-doc.py's check of README's variable table against plugin/mk_param.h, with its
negative controls: the real pair agrees; a README with one row dropped, or a registry with one
default changed, is stale; a registry entry the parser cannot read (an escaped quote in its
description) is an error naming it, not a row quietly missing from both sides.

usage: test_param_doc.py <scripts/param-doc.py> <README.md> <plugin/mk_param.h>
"""
import pathlib
import re
import subprocess
import sys
import tempfile

from checks import expect, finish  # test/unit/checks.py, beside this file


def run(tool, *args):
    p = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    tool, readme, registry = sys.argv[1:4]
    text, reg = pathlib.Path(readme).read_text(), pathlib.Path(registry).read_text()
    rc, out = run(tool, "--registry", registry, "--check", readme)
    expect(rc == 0 and "matches" in out, "README's table matches the registry", out)
    with tempfile.TemporaryDirectory() as d:
        rows = [l for l in text.splitlines() if l.startswith("| `NCCL_MK_")]
        dropped = pathlib.Path(d, "README.md")
        dropped.write_text(text.replace(rows[len(rows) // 2] + "\n", "", 1) if rows else "")
        rc, out = run(tool, "--registry", registry, "--check", str(dropped))
        expect(rows and rc == 1 and "stale" in out, "a README with one row dropped is stale", out)

        changed = pathlib.Path(d, "changed.h")
        changed.write_text(re.sub(r'(X\(INT, TIMEOUT_MS, "NCCL_MK_TIMEOUT_MS", ")(\d+)"', r'\g<1>1\2"', reg, count=1))
        rc, out = run(tool, "--registry", str(changed), "--check", readme)
        expect(changed.read_text() != reg and rc == 1 and "stale" in out, "a registry default changed: stale", out)

        unparsed = pathlib.Path(d, "unparsed.h")
        unparsed.write_text(reg.replace('"InfiniBand service level"', '"InfiniBand \\"service\\" level"', 1))
        rc, out = run(tool, "--registry", str(unparsed), "--check", readme)
        expect(unparsed.read_text() != reg and rc != 0 and "unparsed: IB_SL" in out,
               "an entry the parser cannot read is named, not dropped", out)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
