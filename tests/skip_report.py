#!/usr/bin/env python3
"""Every skip of a CTest run, read from its JUnit file (ctest --output-junit FILE --test-output-size-passed N):
the tests CTest skipped, and the parts of tests that ran but skipped something ("SKIP:" lines, GoogleTest's
"[  SKIPPED ]" inside the MPI tests), each with its reason.

    python3 tests/skip_report.py RUN.xml

A skip for a missing package (a reason ending "(apt-get install P)", tests/lib/skip.sh's skip_missing) could
have been fixed by bootstrap.sh, which installs every package the suite needs; such a skip and a skipped test
that gives no reason are marked, and make the exit status 1. Otherwise 0."""
import re
import sys
import xml.etree.ElementTree as ET

GTEST_SKIPPED = re.compile(r"^\[  SKIPPED \] (\S+)")
GTEST_RUN = re.compile(r"^\[ RUN      \] (\S+)")
SKIP_LINE = re.compile(r"^SKIP: (.*)$")
PACKAGE = re.compile(r"\(apt-get install ([A-Za-z0-9.+ -]+)\)$")


def reasons(output):
    """(what, reason) for each skip the output reports: "SKIP:" lines, and GoogleTest's skipped tests with the
    message between their "file:line: Skipped" and [ SKIPPED ] lines (other ranks' lines may come before)."""
    found = []
    current, message = None, []
    for line in output.splitlines():
        line = line.rstrip()
        m = SKIP_LINE.match(line)
        if m:
            found.append(("", m.group(1)))
            continue
        m = GTEST_RUN.match(line)
        if m:
            current, message = m.group(1), []
            continue
        m = GTEST_SKIPPED.match(line)
        if m and current == m.group(1):
            text = " ".join(s.strip() for s in message if s.strip())
            found.append((current, text or "(GoogleTest gave no message)"))
            current = None
            continue
        if current is not None:
            if line.endswith(": Skipped"):  # GoogleTest's "file:line: Skipped": the message follows
                message = []
            else:
                message.append(line)
    unique = []
    for item in found:  # the MPI tests' ranks each print the same skip
        if item not in unique:
            unique.append(item)
    return unique


def main():
    if len(sys.argv) != 2:
        print("usage: skip_report.py RUN.xml", file=sys.stderr)
        return 2
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"skip_report.py: {sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    by_reason, bad = {}, 0  # reason -> (mark, [where]), in the order first met
    total = 0
    for case in root.iter("testcase"):
        name = case.get("name")
        output = case.findtext("system-out") or ""
        skipped = case.get("status") == "notrun" and case.find("skipped") is not None
        found = reasons(output)
        if skipped and not found:
            found = [("", "no reason given")]
        for what, reason in found:
            # A test CTest skipped is named as CTest names it; a part of a test names the test and the part.
            if skipped:
                where = name
            else:
                where = f"{name}: {what}" if what else f"{name} (part)"
            fixable = PACKAGE.search(reason)
            mark = ""
            if fixable:
                mark = f"NOT ALLOWED: bootstrap.sh test should install {fixable.group(1)}"
            elif reason == "no reason given":
                mark = "NOT ALLOWED: a skip must say why"
            if mark:
                bad += 1
            by_reason.setdefault(reason, (mark, []))[1].append(where)
            total += 1
    if bad:
        print(f"skips: {total}, for {len(by_reason)} reason(s); {bad} NOT ALLOWED (marked)")
    else:
        print(f"skips: {total}, for {len(by_reason)} reason(s), none for a package the test command installs")
    for reason, (mark, where) in by_reason.items():
        print(f"  {reason}" + (f"  <- {mark}" if mark else "") + f"  [{len(where)}]")
        for w in where:
            print(f"      {w}")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
