#!/usr/bin/env python3
"""tests/kernels/fingerprint_reference_test.py: docs/fingerprint.md's pure-Python reference of
xxh64-interleaved-v1 is run exactly as the document prints it (its "Reference" code block), and
its values must equal the document's test-vector table, which fingerprint_test.cpp checks
against the CPU fingerprint: the document, the reference and the C++ code agree.

Usage: fingerprint_reference_test.py DOCS/fingerprint.md"""

import re
import sys


def main(path):
    text = open(path, encoding="utf-8").read()
    section = text.split("## Reference", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(code, path + " (Reference)", "exec"), namespace)  # its own asserts run too
    fingerprint = namespace["fingerprint"]
    table = text.split("## Test vectors", 1)[1].split("##", 1)[0]
    rows = re.findall(r"^\|\s*([\d,]+)[^|]*\|\s*(\d+)\s*\|\s*`(0x[0-9a-f]+)`\s*\|$", table, re.M)
    if len(rows) < 5:
        print("FAIL: the test-vector table has %d rows, expected 5" % len(rows))
        return 1
    failed = 0
    for length, chunks, expected in rows:
        n = int(length.replace(",", ""))
        data = bytes((i * 7 + 3) % 251 for i in range(n))
        got = fingerprint(data)
        ok = got == int(expected, 16) and int(chunks) == (n + (1 << 20) - 1) // (1 << 20)
        print("%s L=%d: %#018x (document %s, %s chunks)" % ("ok" if ok else "FAIL", n, got,
                                                             expected, chunks))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
