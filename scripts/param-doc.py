#!/usr/bin/env python3
"""Prints README's table of environment variables from the one registry,
plugin/mk_param.h. With --check README.md, exits 1 if README's table (between the
PARAMS-BEGIN/PARAMS-END markers) differs from the registry; --update README.md rewrites it."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENTRY = re.compile(
    r'X\((INT|STR),\s*(\w+),\s*"([^"]+)",\s*"([^"]*)",\s*(-?\d+),\s*(-?\d+),\s*"([^"]*)",\s*'
    r'"([^"]*)"\)', re.S)


def table():
    src = (ROOT / "plugin" / "mk_param.h").read_text()
    body = src[src.index("#define MK_PARAM_LIST"):src.index("enum mk_param_id")]
    body = re.sub(r'"\s*\\\s*\n\s*"', "", body)  # join string continuations
    body = body.replace("\\\n", " ")
    rows = ["| variable | type | default | values | meaning |", "|---|---|---|---|---|"]
    for kind, _id, env, default, lo, hi, choices, doc in ENTRY.findall(body):
        values = choices.replace("|", ", ") if kind == "STR" else f"{lo} to {hi}"
        values = values or "any"
        default = default or "(empty)"
        rows.append(f"| `{env}` | {kind.lower()} | {default} | {values} | {doc} |")
    return "\n".join(rows)


SECTION = re.compile(r"(<!-- PARAMS-BEGIN -->\n)(.*?)(\n<!-- PARAMS-END -->)", re.S)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        path = pathlib.Path(sys.argv[2])
        text = SECTION.sub(lambda m: m.group(1) + table() + m.group(3), path.read_text())
        path.write_text(text)
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        readme = pathlib.Path(sys.argv[2]).read_text()
        m = re.search(r"<!-- PARAMS-BEGIN -->\n(.*?)\n<!-- PARAMS-END -->", readme, re.S)
        if not m:
            print("README has no PARAMS-BEGIN/PARAMS-END section")
            return 1
        if m.group(1).strip() != table().strip():
            print("README's variable table is stale; regenerate with scripts/param-doc.py")
            return 1
        print("README's variable table matches plugin/mk_param.h")
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
