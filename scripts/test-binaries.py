#!/usr/bin/env python3
"""Copies the test executables named in `cargo test --no-run --message-format=json`
(read from stdin) into DEST_DIR, each under its target name; with NAMES, only those.
usage: cargo test ... --no-run --message-format=json | scripts/test-binaries.py DEST_DIR [NAME ...]"""
import json
import shutil
import sys

dest, names = sys.argv[1], set(sys.argv[2:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        name = m["target"]["name"]
        if not names or name in names:
            shutil.copy(m["executable"], f"{dest}/{name}")
