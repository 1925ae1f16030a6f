#!/usr/bin/env python3
"""Re-checks the verl and RLinf key table of docs/rl.md against checkouts.

Outside the tests (it needs the frameworks' sources). For every row of the table
between the `keys:start` and `keys:end` markers, it opens the named file in the
checkout, finds the named line, and checks that the line defines the key: in a
YAML file, the line's own key is the key's last component and its parents, read
from the indentation above it, are the key's leading components; in a Python
file, the line reads the key's last component. A row marked `free-form`
names the parent mapping (verl's `override_*_config` dictionaries pass their
entries to Megatron-Core as they are); the check is then on that parent.

    python3 tools/rl_keys_check.py --verl ~/src/verl --rlinf ~/src/RLinf
    python3 tools/rl_keys_check.py --verl ... --rlinf ... --locate keys.txt

`--locate` reads lines `framework dotted.key` and prints a table row for each
key found in the framework's candidate files (to write the table, not to trust
it: the check above is what verifies it). Exit status 1 when any row fails.
"""

import argparse
import pathlib
import re
import subprocess
import sys

CANDIDATES = {
    "verl": [
        "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml",
        "verl/trainer/config/ppo_megatron_trainer.yaml",
    ],
    "rlinf": [
        "examples/reasoning/config/math/qwen2.5-1.5b-grpo-megatron-pipeline.yaml",
        "examples/reasoning/config/math/qwen2.5-1.5b-ppo-megatron.yaml",
        "examples/reasoning/config/math/qwen3-30b-grpo-megatron.yaml",
        "examples/reasoning/config/math/qwen2.5-7b-grpo-megatron.yaml",
        "examples/reasoning/config/math/moonlight-16b-grpo-megatron.yaml",
    ],
}

KEY_LINE = re.compile(r"^(\s*)(?:'([^']+)'|\"([^\"]+)\"|([A-Za-z0-9_,]+))\s*:")


def parse(path):
    """Each line's (indent, key) or None, and the dotted path of every keyed line."""
    lines = path.read_text().splitlines()
    paths = {}
    stack = []  # (indent, key)
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#") or line.lstrip().startswith("-"):
            continue
        m = KEY_LINE.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        key = m.group(2) or m.group(3) or m.group(4)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        paths[number] = ".".join(k for _, k in stack)
    return paths


def locate(root, framework, key):
    """The first candidate file and line defining `key` or its deepest ancestor."""
    parts = key.split(".")
    for depth in range(len(parts), 0, -1):
        want = ".".join(parts[:depth])
        for rel in CANDIDATES[framework]:
            path = root / rel
            if not path.is_file():
                continue
            for number, dotted in parse(path).items():
                if dotted == want:
                    return rel, number, depth < len(parts)
    return None


def head(root):
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def check_python(path, line, key, note):
    """A key read in Python: the line names the key's last component, or, for a
    free-form row, the function named first in backticks in the note."""
    lines = path.read_text().splitlines()
    if not 1 <= line <= len(lines):
        return False
    text = lines[line - 1]
    if "free-form" in note:
        m = re.search(r"`([^`]+)`", note)
        return bool(m) and m.group(1) in text
    last = key.split(".")[-1]
    return f'"{last}"' in text or f"'{last}'" in text or f".{last}" in text


def table_rows(doc):
    text = doc.read_text()
    start = text.index("<!-- keys:start -->")
    end = text.index("<!-- keys:end -->")
    for line in text[start:end].splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in ("verl", "rlinf"):
            continue
        yield cells


def check(roots, doc):
    failures = 0
    rows = 0
    for cells in table_rows(doc):
        framework, key, where = cells[0], cells[1], cells[2]
        note = cells[3] if len(cells) > 3 else ""
        rows += 1
        rel, _, line = where.rpartition(":")
        path = roots[framework] / rel
        if not path.is_file():
            print(f"FAIL {framework} {key}: {rel} is not in the checkout")
            failures += 1
            continue
        if rel.endswith(".py"):
            ok, dotted = check_python(path, int(line), key, note), "a Python line"
        else:
            dotted = parse(path).get(int(line))
            ok = dotted == key or ("free-form" in note and key.startswith(dotted + ".") if dotted else False)
        if not ok:
            found = locate(roots[framework], framework, key)
            hint = f" (found at {found[0]}:{found[1]})" if found else ""
            print(f"FAIL {framework} {key}: {where} defines {dotted!r}{hint}")
            failures += 1
    print(f"{rows} rows checked; {failures} failed; verl at {head(roots['verl'])}, RLinf at {head(roots['rlinf'])}")
    return failures == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verl", required=True, type=pathlib.Path)
    ap.add_argument("--rlinf", required=True, type=pathlib.Path)
    ap.add_argument("--doc", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent / "docs" / "rl.md")
    ap.add_argument("--locate", type=pathlib.Path)
    a = ap.parse_args()
    roots = {"verl": a.verl, "rlinf": a.rlinf}
    if a.locate:
        for line in a.locate.read_text().splitlines():
            if not line.strip():
                continue
            framework, key = line.split()
            found = locate(roots[framework], framework, key)
            if found is None:
                print(f"| {framework} | `{key}` | NOT FOUND | |")
            else:
                rel, number, partial = found
                note = "free-form: passed to Megatron-Core as named" if partial else ""
                print(f"| {framework} | `{key}` | `{rel}:{number}` | {note} |")
        return 0
    return 0 if check(roots, a.doc) else 1


if __name__ == "__main__":
    sys.exit(main())
