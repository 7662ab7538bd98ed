#!/usr/bin/env bash
# Gate: source layout. Fails, naming each offender, when
#   1. `python3 ../shared/tools/modcycles.py engine/src` shows any import cycle (the last one,
#      conn<->engine, went when `Engine`'s handle moved to `engine/handle.rs`, below `conn`);
#   2. engine/src has more than 4 lines with `feature = "rdma"` outside engine/src/fabric/rdma/
#      (fabric-specific code lives under its fabric's directory);
#   3. a source file of any crate is over 800 lines.
# Rule 3 covers every workspace member's src/ (rings cm engine bench testkit ffi, read from
# Cargo.toml's `members`). Tests are excepted: files under a `tests/` or `benches/` directory,
# files with an inner `#![cfg(test)]`, and module files their parent declares under
# `#[cfg(test)]` (e.g. a `tests.rs` file of `#[cfg(test)] mod tests;`), with everything below
# them. Examples (`*/examples/`) and build scripts are not crate source (no library or binary
# of the workspace is built from them) and are not checked.
# modcycles.py comes from the read-only shared/ directory beside the repository (CI puts it
# there); without it the gate fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

MAX_LINES=800
MAX_RDMA_CFG=4
tool=../shared/tools/modcycles.py
fail=0
bad() { echo "layout: FAIL: $*"; fail=$((fail + 1)); }

# 1. Import cycles between engine modules.
if [ ! -f "$tool" ]; then
  echo "layout: FAIL: $tool not found (the shared/ directory must sit beside the repository)" >&2
  exit 1
fi
if ! cycles=$(python3 "$tool" engine/src); then
  echo "layout: FAIL: python3 $tool engine/src failed:" >&2
  echo "$cycles" >&2
  exit 1
fi
summary=$(printf '%s\n' "$cycles" | grep '^cycles: ' || true)
if [ -z "$summary" ]; then
  echo "layout: FAIL: no summary line from $tool; it printed:" >&2
  echo "$cycles" >&2
  exit 1
fi
echo "layout: modcycles engine/src: $summary"
while IFS= read -r line; do
  case "$line" in
    "cycle of "*) bad "import cycle in engine/src: $line" ;;
  esac
done <<<"$cycles"

# 2. rdma cfg lines outside the rdma fabric.
rdma=$(grep -rn --include='*.rs' -F 'feature = "rdma"' engine/src | grep -v '^engine/src/fabric/rdma/' || true)
n=$(printf '%s' "$rdma" | grep -c '' || true)
if [ "$n" -gt "$MAX_RDMA_CFG" ]; then
  bad "$n lines with feature = \"rdma\" outside engine/src/fabric/rdma/ (at most $MAX_RDMA_CFG):"
  printf '%s\n' "$rdma" | sed 's/^/layout:     /'
else
  echo "layout: rdma cfg lines outside engine/src/fabric/rdma/: $n (at most $MAX_RDMA_CFG)"
fi

# 3. Source files over MAX_LINES lines, tests excepted.
big=$(python3 - "$MAX_LINES" <<'EOF'
import os, re, sys

limit = int(sys.argv[1])
members = re.search(r'members\s*=\s*\[(.*?)\]', open('Cargo.toml').read(), re.S)
members = re.findall(r'"([^"]+)"', members.group(1)) if members else []
TEST_CFG = re.compile(r'#\[cfg\((test\s*\)|all\(\s*test\b)')
memo = {}

def declared_test_only(parent, name):
    """`mod name;` in `parent` carries a #[cfg(test)] (or #[cfg(all(test, ..))]) attribute."""
    lines = open(parent).read().splitlines()
    decl = re.compile(r'^\s*((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+' + re.escape(name) + r'\s*;')
    for i, l in enumerate(lines):
        d = decl.match(l)
        if not d:
            continue
        if TEST_CFG.search(d.group(1)):
            return True
        # The attribute and comment lines right above it.
        j = i - 1
        while j >= 0 and re.match(r'^\s*(#\[[^\]]*\]\s*$|//)', lines[j]):
            if TEST_CFG.search(lines[j]):
                return True
            j -= 1
    return False

def test_only(path, root):
    """`path` (under crate src `root`) is compiled for tests only."""
    if path in memo:
        return memo[path]
    rel = os.path.relpath(path, root).split(os.sep)
    memo[path] = False
    if 'tests' in rel[:-1] or 'benches' in rel[:-1]:
        memo[path] = True
    elif re.search(r'^\s*#!\[cfg\((test\s*\)|all\(\s*test\b)', open(path).read(), re.M):
        memo[path] = True
    elif rel not in (['lib.rs'], ['main.rs']):
        # The module's name and the file that declares it (2018 layout: a/b.rs or a/b/mod.rs
        # is declared by a.rs or a/mod.rs; a top-level one by lib.rs or main.rs).
        mod_dir = rel[:-1] if rel[-1] == 'mod.rs' else rel[:-1] + [rel[-1][:-3]]
        name, up = mod_dir[-1], mod_dir[:-1]
        if up:
            parents = [os.path.join(root, *up) + '.rs', os.path.join(root, *up, 'mod.rs')]
        else:
            parents = [os.path.join(root, 'lib.rs'), os.path.join(root, 'main.rs')]
        for p in parents:
            if os.path.isfile(p) and (declared_test_only(p, name) or test_only(p, root)):
                memo[path] = True
                break
    return memo[path]

for m in members:
    root = os.path.join(m, 'src')
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            path = os.path.join(d, f)
            if not f.endswith('.rs') or test_only(path, root):
                continue
            n = len(open(path).read().splitlines())
            if n > limit:
                print(f"{path} ({n} lines)")
EOF
)
if [ -n "$big" ]; then
  while IFS= read -r f; do bad "source file over $MAX_LINES lines: $f"; done <<<"$big"
else
  echo "layout: no source file over $MAX_LINES lines"
fi

if [ "$fail" -gt 0 ]; then
  echo "layout: $fail problem(s)"
  exit 1
fi
echo "layout: ok"
