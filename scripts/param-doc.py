#!/usr/bin/env python3
"""Prints README's table of environment variables from the one registry,
plugin/mk_param.h. With --check README.md, exits 1 if README's table (between the
PARAMS-BEGIN/PARAMS-END markers) differs from the registry; --update README.md rewrites it.
Every X( entry of the registry must parse (a description with an escaped quote, a bound
written as a macro): one that does not is an error naming it, not a row left out of both.
--registry PATH reads another copy of mk_param.h (the unit test's negative controls)."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENTRY = re.compile(
    r'X\((INT|STR),\s*(\w+),\s*"([^"]+)",\s*"([^"]*)",\s*(-?\d+),\s*(-?\d+),\s*"([^"]*)",\s*'
    r'"([^"]*)"\)', re.S)


def table(registry):
    src = registry.read_text()
    body = src[src.index("#define MK_PARAM_LIST"):src.index("enum mk_param_id")]
    body = re.sub(r'"\s*\\\s*\n\s*"', "", body)  # join string continuations
    body = body.replace("\\\n", " ")
    entries = ENTRY.findall(body)
    named = re.findall(r'X\(\s*\w+\s*,\s*(\w+)', body)
    if len(entries) != len(named):
        parsed = {e[1] for e in entries}
        bad = ", ".join(n for n in named if n not in parsed)
        sys.exit(f"param-doc: {registry}: {len(named)} entries, {len(entries)} parsed; unparsed: {bad}")
    rows = ["| variable | type | default | values | meaning |", "|---|---|---|---|---|"]
    for kind, _id, env, default, lo, hi, choices, doc in entries:
        values = choices.replace("|", ", ") if kind == "STR" else f"{lo} to {hi}"
        values = values or "any"
        default = default or "(empty)"
        rows.append(f"| `{env}` | {kind.lower()} | {default} | {values} | {doc} |")
    return "\n".join(rows)


SECTION = re.compile(r"(<!-- PARAMS-BEGIN -->\n)(.*?)(\n<!-- PARAMS-END -->)", re.S)


def main():
    registry = ROOT / "plugin" / "mk_param.h"
    if len(sys.argv) >= 3 and sys.argv[1] == "--registry":
        registry = pathlib.Path(sys.argv[2])
        del sys.argv[1:3]
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        path = pathlib.Path(sys.argv[2])
        text = SECTION.sub(lambda m: m.group(1) + table(registry) + m.group(3), path.read_text())
        path.write_text(text)
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        readme = pathlib.Path(sys.argv[2]).read_text()
        m = re.search(r"<!-- PARAMS-BEGIN -->\n(.*?)\n<!-- PARAMS-END -->", readme, re.S)
        if not m:
            print("README has no PARAMS-BEGIN/PARAMS-END section")
            return 1
        if m.group(1).strip() != table(registry).strip():
            print("README's variable table is stale; regenerate with scripts/param-doc.py")
            return 1
        print("README's variable table matches plugin/mk_param.h")
        return 0
    print(table(registry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
