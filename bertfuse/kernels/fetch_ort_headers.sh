#!/usr/bin/env bash
# Fetch ONNX Runtime's C/C++ API headers (onnxruntime_c_api.h, onnxruntime_cxx_api.h, ...)
# from Debian's libonnxruntime-dev package, without touching the system's apt state:
# a private apt state/cache directory with a sources list for one suite, then
# `apt-get download libonnxruntime-dev` and `dpkg -x`. Only headers are kept.
#
# Prints the include directory (the one holding onnxruntime_cxx_api.h) on stdout; messages go
# to stderr. A second run with the headers already cached downloads nothing.
#
# Users elsewhere can skip this and set ORT_INCLUDE_DIR to an ONNX Runtime release's include/.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: fetch_ort_headers.sh [--cache-dir DIR] [--suite SUITE] [--version VER] [--mirror URL] [--dest DIR]

Fetch ONNX Runtime's C/C++ API headers from Debian's libonnxruntime-dev and print their include dir.

  --cache-dir DIR  where headers are cached (default: ${XDG_CACHE_HOME:-~/.cache}/bertfuse/ort-headers)
  --suite SUITE    Debian suite to read (default: trixie)
  --version VER    upstream version the package must have (default: 1.21.0)
  --mirror URL     Debian mirror (default: http://deb.debian.org/debian)
  --dest DIR       also copy the headers into DIR (created; must be empty or absent)
  -h, --help       this help
EOF
}

die() { echo "fetch_ort_headers: $*" >&2; exit 2; }

suite=trixie
version=1.21.0
mirror=http://deb.debian.org/debian
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/bertfuse/ort-headers"
dest=""

while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --cache-dir|--suite|--version|--mirror|--dest)
            [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
            case "$1" in
                --cache-dir) cache_root="$2" ;;
                --suite) suite="$2" ;;
                --version) version="$2" ;;
                --mirror) mirror="$2" ;;
                --dest) dest="$2" ;;
            esac
            shift 2 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# Names end up in paths: keep them to plain tokens.
[[ "$suite" =~ ^[a-z0-9-]+$ ]] || die "--suite '$suite' is not a Debian suite name"
[[ "$version" =~ ^[0-9]+(\.[0-9]+)*$ ]] || die "--version '$version' is not a version like 1.21.0"
if [ -n "$dest" ] && [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    die "--dest '$dest' exists and is not empty (nothing is overwritten)"
fi

include_dir="$cache_root/$suite-$version/include"

copy_to_dest() {
    [ -n "$dest" ] || return 0
    mkdir -p "$dest"
    cp -p "$include_dir"/*.h "$dest"/
    echo "fetch_ort_headers: copied headers to $dest" >&2
}

if [ -f "$include_dir/onnxruntime_cxx_api.h" ]; then
    copy_to_dest
    echo "$include_dir"
    exit 0
fi

for tool in apt-get dpkg-deb; do
    command -v "$tool" >/dev/null || die "$tool not found (needs a Debian/Ubuntu host; elsewhere set ORT_INCLUDE_DIR to an ONNX Runtime release's include dir)"
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || die "$keyring missing (install debian-archive-keyring)"

work="$(mktemp -d "${TMPDIR:-/tmp}/bertfuse-ort-headers.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial" "$work/parts" "$work/pkg"
: > "$work/state/status"
printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$suite" > "$work/sources.list"

apt_opts=(
    -o "Dir::State=$work/state"
    -o "Dir::State::status=$work/state/status"
    -o "Dir::Cache=$work/cache"
    -o "Dir::Etc::SourceList=$work/sources.list"
    -o "Dir::Etc::SourceParts=$work/parts"
    -o "APT::Architecture=$(dpkg --print-architecture 2>/dev/null || echo amd64)"
    -o "Debug::NoLocking=1"
    # The private dirs are ours (mktemp 0700): download as ourselves, not as _apt.
    -o "APT::Sandbox::User=$(id -un)"
)

echo "fetch_ort_headers: reading $mirror $suite (private apt state in $work)" >&2
apt-get "${apt_opts[@]}" -qq update >&2 || die "apt-get update for $suite failed (mirror unreachable?)"

candidate="$(apt-cache "${apt_opts[@]}" policy libonnxruntime-dev | awk '/Candidate:/ {print $2}')"
[ -n "$candidate" ] && [ "$candidate" != "(none)" ] || die "libonnxruntime-dev not found in $suite"
upstream="${candidate#*:}"; upstream="${upstream%%[-+~]*}"
[ "$upstream" = "$version" ] || die "$suite has libonnxruntime-dev $candidate, not $version (pass --version $upstream to accept it)"

(cd "$work/pkg" && apt-get "${apt_opts[@]}" -qq download "libonnxruntime-dev=$candidate" >&2) \
    || die "apt-get download libonnxruntime-dev=$candidate failed"
deb="$(ls "$work"/pkg/*.deb)"
dpkg-deb -x "$deb" "$work/root"

header="$(find "$work/root" -name onnxruntime_cxx_api.h -print -quit)"
[ -n "$header" ] || die "$deb holds no onnxruntime_cxx_api.h"
src_dir="$(dirname "$header")"

# Publish atomically: a half-copied include dir is never seen as cached.
mkdir -p "$cache_root/$suite-$version"
staged="$(mktemp -d "$cache_root/$suite-$version/.include.XXXXXX")"
trap 'rm -rf "$work" "$staged"' EXIT
cp -p "$src_dir"/*.h "$staged"/
printf '%s\n' "libonnxruntime-dev $candidate ($suite, $mirror)" > "$staged/SOURCE.txt"
rm -rf "$include_dir"
mv "$staged" "$include_dir"

copy_to_dest
echo "$include_dir"
