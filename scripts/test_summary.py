"""Prints the one-line summary of a meson test run ('N passed, N failed, N skipped')."""
import json
import sys

counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        result = json.loads(line).get("result", "")
        if result in ("OK", "EXPECTEDFAIL"):
            counts["OK"] += 1
        elif result == "SKIP":
            counts["SKIP"] += 1
        else:
            counts["FAIL"] += 1
print(f"{counts['OK']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
