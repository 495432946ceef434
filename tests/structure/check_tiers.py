#!/usr/bin/env python3
"""A `fast` case must be fast: the tiers (cmake/Testing.cmake) are assigned by
name lists, so a new slow case is `fast` until someone lists it; this check,
run by scripts/test on the CTest run it just made, fails when a case labelled
`fast` took longer than the limit, and names it with where to relabel it.

  check_tiers.py BUILD_DIR JUNIT_XML [--limit SECONDS]

JUNIT_XML is what `ctest --output-junit` wrote for that run (the time of each
case); the labels are CTest's own (`ctest --show-only=json-v1`). The limit
(default 2.5 s, or FAST_TIER_LIMIT_S) leaves room over "well under a second"
for a CI machine 1.7x slower than a developer's and for two tests at once;
a case that takes seconds is over it.
"""
import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir")
    ap.add_argument("junit")
    ap.add_argument("--limit", type=float, default=float(os.environ.get("FAST_TIER_LIMIT_S", "2.5")))
    args = ap.parse_args()

    shown = subprocess.run(["ctest", "--test-dir", args.build_dir, "--show-only=json-v1"], check=True,
                           capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(shown).get("tests", []):
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                labels[test["name"]] = prop.get("value", [])

    try:
        cases = ET.parse(args.junit).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print(f"check_tiers: cannot read {args.junit} ({e}); run ctest with --output-junit first", file=sys.stderr)
        return 2
    checked, slow = 0, []
    for case in cases:
        name = case.get("name")
        if case.get("status") != "run" or "fast" not in labels.get(name, []):
            continue  # failed, skipped or not run cases have no time to judge; other tiers may take long
        checked += 1
        seconds = float(case.get("time", "0"))
        if seconds > args.limit:
            slow.append((seconds, name))
    if checked == 0:
        print(f"check_tiers: no passed `fast` case in {args.junit}: nothing was checked", file=sys.stderr)
        return 2
    if slow:
        for seconds, name in sorted(slow, reverse=True):
            print(f"check_tiers: {name} is labelled `fast` but took {seconds:.2f} s (limit {args.limit:g} s)",
                  file=sys.stderr)
        print("check_tiers: make it faster, or label it `slow`: a GoogleTest case by adding its name to "
              "GPUFEED_SLOW_TESTS in cmake/Testing.cmake, an add_test by LABELS slow where CMakeLists.txt "
              "defines it", file=sys.stderr)
        return 1
    print(f"check_tiers: {checked} `fast` cases, each under {args.limit:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
