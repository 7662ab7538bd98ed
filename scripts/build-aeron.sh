#!/usr/bin/env bash
# scripts/build-aeron.sh - builds issue #21's reference peer: Aeron's C media driver (aeronmd)
# and C samples (cping, cpong), outside the project tree, from an Aeron source checkout.
# Prints the directory that holds the three binaries (the AERON_BIN of aeron-compare.sh).
#
# usage: scripts/build-aeron.sh SRC
#   SRC   an Aeron source tree, or a git directory holding one (a clone of
#         github.com/real-logic/aeron, bare or not); its HEAD is built.
# Knobs (environment):
#   AERON_BUILD=/tmp/aeron-build   where the sources are unpacked and the build goes (never
#                                  inside this repository); rebuilt only when SRC's HEAD moved
#   JOBS=2                         parallel compile jobs
#
# Installs what is missing (as root): uuid-dev, libbsd-dev, zlib1g-dev with apt, and CMake >=
# 3.26 from PyPI into $AERON_BUILD/venv when the system's is older (Debian 12 has 3.25).
# Builds with -DBUILD_AERON_ARCHIVE_API=OFF (the archive needs Java), Release. Exit status 0
# and the binaries' directory on stdout; 2 when something cannot be installed or built.
set -euo pipefail

SRC=${1:?usage: scripts/build-aeron.sh SRC (an Aeron source tree or git directory)}
BUILD=${AERON_BUILD:-/tmp/aeron-build}
JOBS=${JOBS:-2}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
case "$BUILD/" in
  "$repo"/*) echo "build-aeron: AERON_BUILD=$BUILD is inside the repository; use a directory outside it" >&2; exit 2 ;;
esac
log() { echo "build-aeron: $*" >&2; }

# 1. The sources: SRC's HEAD, unpacked once per commit.
if git --git-dir="$SRC" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  gitdir=$SRC
elif git -C "$SRC" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  gitdir=$(git -C "$SRC" rev-parse --absolute-git-dir)
else
  gitdir=""
fi
if [ -n "$gitdir" ]; then
  rev=$(git --git-dir="$gitdir" rev-parse HEAD)
  if [ "$(cat "$BUILD/src.rev" 2>/dev/null)" != "$rev" ]; then
    log "unpacking $rev from $gitdir"
    rm -rf "$BUILD/src" "$BUILD/b"
    mkdir -p "$BUILD/src"
    git --git-dir="$gitdir" archive --format=tar HEAD | tar -x -C "$BUILD/src"
    echo "$rev" >"$BUILD/src.rev"
  fi
  srcdir=$BUILD/src
else
  [ -f "$SRC/CMakeLists.txt" ] || { log "$SRC is neither a git directory nor an Aeron source tree"; exit 2; }
  srcdir=$(cd "$SRC" && pwd)
fi

# 2. What the C build needs.
missing=()
for p in uuid-dev libbsd-dev zlib1g-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2 ||
    { log "apt-get install ${missing[*]} failed"; exit 2; }
fi
cmake=cmake
ver=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' || true)
if [ -z "$ver" ] || [ "$(echo "$ver" | awk '{print ($1 > 3 || ($1 == 3 && $2 >= 26))}')" != 1 ]; then
  if [ ! -x "$BUILD/venv/bin/cmake" ]; then
    log "system CMake ${ver:-none} < 3.26: installing cmake from PyPI into $BUILD/venv"
    { python3 -m venv "$BUILD/venv" && "$BUILD/venv/bin/pip" install -q 'cmake>=3.26'; } >&2 ||
      { log "pip install cmake failed"; exit 2; }
  fi
  cmake=$BUILD/venv/bin/cmake
fi

# 3. Configure and build the three targets.
if [ ! -f "$BUILD/b/CMakeCache.txt" ]; then
  log "configuring"
  "$cmake" -S "$srcdir" -B "$BUILD/b" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_AERON_ARCHIVE_API=OFF -DAERON_TESTS=OFF -DAERON_SYSTEM_TESTS=OFF \
    -DAERON_BUILD_SAMPLES=ON -DAERON_BUILD_DOCUMENTATION=OFF >&2 ||
    { log "cmake configure failed"; exit 2; }
fi
log "building aeronmd cping cpong (-j$JOBS)"
"$cmake" --build "$BUILD/b" -j "$JOBS" --target aeronmd cping cpong >&2 ||
  { log "build failed"; exit 2; }
bin=$BUILD/b/binaries
for b in aeronmd cping cpong; do
  [ -x "$bin/$b" ] || { log "no $bin/$b after the build"; exit 2; }
done
echo "$bin"
