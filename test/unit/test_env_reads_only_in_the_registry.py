#!/usr/bin/env python3
"""The library reads the environment in one place: plugin/param.c, behind the registry of
plugin/mk_param.h (CONTRIBUTING: "No getenv elsewhere"), so that every variable is validated,
printed and documented in README's table. Scans fused/, plugin/, transport/ and include/ for
getenv / secure_getenv calls outside comments and strings; its negative control is a made-up
tree with one stray call, which it must name.

usage: test_env_reads_only_in_the_registry.py <repository root>"""
import pathlib
import re
import sys
import tempfile

from checks import expect, finish  # test/unit/checks.py, beside this file

DIRS = ("fused", "plugin", "transport", "include")
ALLOWED = {"plugin/param.c"}
CALL = re.compile(r"\b(secure_getenv|getenv)\s*\(")
SUFFIXES = {".c", ".h", ".cu", ".cuh"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)


def stray_reads(root):
    found = []
    for d in DIRS:
        for path in sorted((root / d).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.suffix not in SUFFIXES or rel in ALLOWED:
                continue
            text = strip_comments(path.read_text(errors="replace"))
            for m in CALL.finditer(text):
                found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    return found


def main():
    found = stray_reads(pathlib.Path(sys.argv[1]))
    expect(not found, "no getenv outside plugin/param.c (read through plugin/mk_param.h)", "\n".join(found))
    with tempfile.TemporaryDirectory() as d:
        fake = pathlib.Path(d)
        (fake / "plugin").mkdir()
        (fake / "plugin" / "param.c").write_text('const char* v = getenv("NCCL_MK_X");\n')
        (fake / "transport").mkdir()
        (fake / "transport" / "x.c").write_text('/* getenv("A") */\nint f(void) {\n  return !!getenv ("B");\n}\n')
        stray = stray_reads(fake)
        expect(stray == ["transport/x.c:3: getenv"], "negative control: the stray call named, the comment and "
               "param.c not", str(stray))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
