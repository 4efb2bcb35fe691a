#!/usr/bin/env python3
"""Assembles the entries of a PTX module whose names match REGEX (alone, with the
module's header) and prints each one's stack frame and spills, and with --sass where
its spill stores and loads sit: which `setmaxnreg` region (producer `DEALLOC`, consumer
`ALLOC`) each one follows, so a spill is traced to its role in seconds rather than by
assembling the whole module (`cargo xtask check-ptx`).
usage: scripts/ptx-spills.py [--sass] [--ptxas PATH] KERNELS.ptx REGEX"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def find_tool(name, given):
    if given:
        return given
    import nvidia  # the pip package scripts/setup.sh installs

    for p in nvidia.__path__:
        path = os.path.join(p, "cu13", "bin", name)
        if os.path.exists(path):
            return path
    local = os.path.join(os.path.dirname(__file__), "..", ".tools", name, "nvidia", "cu13", "bin", name)
    if os.path.exists(local):
        return local
    sys.exit(f"{name} not found: run scripts/setup.sh")


def entries(ptx, pattern):
    """The module's header (everything before its first entry) and the matching entries."""
    head, blocks, cur, name = [], [], None, None
    for line in open(ptx):
        m = re.match(r"\s*(\.visible\s+)?\.entry\s+(\w+)", line)
        if m:
            cur, name = [line], m.group(2)
        elif cur is not None:
            cur.append(line)
            if line.startswith("}"):
                blocks.append((name, cur))
                cur = None
        elif not blocks:
            head.append(line)
    return head, [(n, b) for n, b in blocks if pattern.search(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true", help="show where each spilling entry's spills sit")
    ap.add_argument("--ptxas")
    ap.add_argument("ptx")
    ap.add_argument("regex")
    a = ap.parse_args()
    ptxas = find_tool("ptxas", a.ptxas)
    head, sel = entries(a.ptx, re.compile(a.regex))
    if not sel:
        sys.exit("no entry matches")
    with tempfile.TemporaryDirectory() as tmp:
        for name, body in sel:
            src, cubin = os.path.join(tmp, name + ".ptx"), os.path.join(tmp, name + ".cubin")
            with open(src, "w") as f:
                f.writelines(head + body)
            out = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", cubin], capture_output=True, text=True)
            report = out.stdout + out.stderr
            m = re.search(rf"Function properties for {name}\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
            if not m:
                print(f"{name}: ptxas failed\n{report}")
                continue
            frame, stores, loads = map(int, m.groups())
            clean = frame == stores == loads == 0
            print(f"{'ok   ' if clean else 'SPILL'} {name}: {frame} B frame, {stores} B spill stores, {loads} B spill loads")
            if a.sass and not clean:
                sass = subprocess.run([find_tool("nvdisasm", None), "-c", cubin], capture_output=True, text=True).stdout
                region = "entry"
                for line in sass.splitlines():
                    if "USETMAXREG" in line:
                        region = "producer warpgroup" if "DEALLOC" in line else "consumers"
                    if "STL" in line or "LDL" in line:
                        print(f"    {region:18} {line.split(';')[0].strip()}")


if __name__ == "__main__":
    main()
