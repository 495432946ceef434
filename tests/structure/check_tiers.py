#!/usr/bin/env python3
"""A `fast` case must be fast: the tiers (cmake/Testing.cmake) are assigned by
name lists, so a new slow case is `fast` until someone lists it; this check,
run by scripts/test on the CTest run it just made, fails when a case labelled
`fast` took longer than the limit, and names it with where to relabel it.

  check_tiers.py BUILD_DIR JUNIT_XML [--limit SECONDS]

JUNIT_XML is what `ctest --output-junit` wrote for that run (the time of each
case); the labels are CTest's own (`ctest --show-only=json-v1`). The limit
(default 2.5 s, or FAST_TIER_LIMIT_S) leaves room over "well under a second"
for a CI machine 1.7x slower than a developer's; a case that takes seconds is
over it. A case over it beside the other tests is run again alone (up to 3
times, its best time kept), so the suite's own load does not fail a fast case;
on a machine busy with other work, wall times say little (FAST_TIER_LIMIT_S
can be raised there, and the run says so).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def time_alone(build_dir: str, name: str, limit: float, tries: int = 3) -> float:
    """The best wall time of `name` run alone by CTest, up to `tries` runs (fewer once under `limit`)."""
    best = float("inf")
    junit = os.path.join(os.path.abspath(build_dir), "ctest-tier-rerun.xml")
    for _ in range(tries):
        subprocess.run(["ctest", "--test-dir", build_dir, "-R", "^" + re.escape(name) + "$", "--output-junit", junit],
                       check=False, capture_output=True)
        for case in ET.parse(junit).getroot().iter("testcase"):
            if case.get("name") == name and case.get("status") == "run":
                best = min(best, float(case.get("time", "inf")))
        if best <= limit:
            break
    return best


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
    confirmed = []
    for seconds, name in sorted(slow, reverse=True):
        alone = time_alone(args.build_dir, name, args.limit)
        if alone > args.limit:
            confirmed.append((seconds, alone, name))
        else:
            print(f"check_tiers: {name} took {seconds:.2f} s beside the other tests, {alone:.2f} s alone: fast")
    if confirmed:
        for seconds, alone, name in confirmed:
            print(f"check_tiers: {name} is labelled `fast` but took {seconds:.2f} s, {alone:.2f} s alone "
                  f"(limit {args.limit:g} s)", file=sys.stderr)
        print("check_tiers: make it faster, or label it `slow`: a GoogleTest case by adding its name to "
              "GPUFEED_SLOW_TESTS in cmake/Testing.cmake, an add_test by LABELS slow where CMakeLists.txt "
              "defines it", file=sys.stderr)
        return 1
    print(f"check_tiers: {checked} `fast` cases, each under {args.limit:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
