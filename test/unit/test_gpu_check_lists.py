#!/usr/bin/env python3
"""scripts/gpu-check.sh's scenario lists against the GPU test programs they run: for every
program a list is run with, the scenarios named in its lists must be exactly the scenarios
its source dispatches (a `{"name", fn}` table entry or a `strcmp(x, "name")`). A misspelt
list entry costs a device call ("unknown scenario"); a scenario missing from every list is
never run. Both are checked without a GPU, on the files as they are; a planted misspelling
and a dropped entry check that the comparison can fail.

usage: test_gpu_check_lists.py <source root>
"""
import pathlib
import re
import sys

from checks import expect, finish  # test/unit/checks.py, beside this file


def listed(check_sh):
    """{program: scenario names} from the `scenarios "$X_TESTS" "$B/test/gpu/program"` lines."""
    lists = {m.group(1): m.group(2).split() for m in re.finditer(r'^(\w+_TESTS)="([^"]*)"', check_sh, re.M)}
    out = {}
    for name, program in re.findall(r'scenarios "\$(\w+_TESTS)" "\$B/test/gpu/(\w+)"', check_sh):
        out.setdefault(program, set()).update(entry.split(":")[0] for entry in lists.get(name, []))
    return out


def dispatched(source):
    table = re.findall(r'\{"(\w+)",\s*\w+\}', source)
    chains = re.findall(r'strcmp\(\w+(?:\[1\])?, "(\w+)"\)', source)
    return set(table) | set(chains)


def mismatches(root, check_sh):
    found = {}
    for program, names in sorted(listed(check_sh).items()):
        source = (root / "test" / "gpu" / f"{program}.cu").read_text()
        known = dispatched(source)
        found[program] = (sorted(names - known), sorted(known - names), len(known))
    return found


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    check_sh = (root / "scripts" / "gpu-check.sh").read_text()
    found = mismatches(root, check_sh)
    expect(len(found) >= 8, f"gpu-check runs scenario lists for {len(found)} test programs")
    for program, (unknown, unlisted, known) in found.items():
        expect(known > 0 and not unknown and not unlisted,
               f"{program}: {known} scenarios; listed but not in the source: {unknown}; "
               f"in the source but in no list: {unlisted}")
    planted = check_sh.replace('FUSED_TESTS="correctness:', 'FUSED_TESTS="corectness:', 1)
    unknown = mismatches(root, planted)["test_fused_ops"][0]
    expect(unknown == ["corectness"], f"a misspelt list entry is caught (found {unknown})")
    dropped = re.sub(r"\sdead_peer:moe_\w+", "", check_sh, count=1)
    unlisted = mismatches(root, dropped)["test_moe"][1]
    expect(unlisted == ["dead_peer"], f"a scenario in no list is caught (found {unlisted})")
    finish()


if __name__ == "__main__":
    main()
