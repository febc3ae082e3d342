#!/bin/bash
# Build cachemgr's Debian package from this checkout, with Debian's own tools (debhelper):
#
#   scripts/build-deb.sh              dist/cachemgr_VERSION_ARCH.deb, then lintian on it
#   scripts/build-deb.sh --no-lintian without the lintian run
#
# The checkout's files (tracked and untracked, not the ignored ones: no .venv, no dist/) are
# copied to a temporary directory and built there with `dpkg-buildpackage -b`, so nothing is
# written next to the checkout and the checkout stays clean. debian/rules builds the wheels
# with the machine's configured pip (it needs the package index at build time only) and
# installs them into the package's own virtualenv (debian/README.Debian). Needs debhelper,
# lintian, gcc, pkg-config, libblkid-dev, python3-dev, python3-venv (scripts/setup.sh
# installs them). Lintian errors fail the build (--fail-on error); warnings are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
lint=1
for a in "$@"; do
    case $a in
    --no-lintian) lint=0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build-deb: unknown option $a" >&2; exit 2 ;;
    esac
done
say() { echo "build-deb: $*" >&2; }
for t in dpkg-buildpackage dh dpkg-checkbuilddeps; do
    command -v "$t" >/dev/null || { say "$t missing (scripts/setup.sh installs debhelper)"; exit 2; }
done

# the package's version is the project's: debian/changelog must say the same
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
deb_version=$(dpkg-parsechangelog -S Version)
if [ "$version" != "$deb_version" ]; then
    say "pyproject.toml says $version, debian/changelog says $deb_version: add a changelog entry (dch -v $version)"
    exit 2
fi
dpkg-checkbuilddeps

arch=$(dpkg --print-architecture)
tmp=$(mktemp -d /var/tmp/cachemgr-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
src=$tmp/cachemgr-$version
mkdir "$src"
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf - | tar -xf - -C "$src"
else
    tar --exclude=./.venv --exclude=./dist --exclude=./.git -cf - . | tar -xf - -C "$src"
fi
# build output never comes from the checkout (a stale debian/cachemgr staging tree, wheels)
rm -rf "$src/debian/cachemgr" "$src/debian/wheels" "$src/debian/buildvenv" "$src/debian/.debhelper"

say "building cachemgr $version for $arch in $src"
t0=$(date +%s)
(cd "$src" && dpkg-buildpackage -b -us -uc) >"$tmp/build.log" 2>&1 || {
    tail -40 "$tmp/build.log" >&2
    say "dpkg-buildpackage failed (the last lines above)"
    exit 1
}
t1=$(date +%s)
deb=cachemgr_${version}_${arch}.deb
mkdir -p dist
mv "$tmp/$deb" "dist/$deb"
say "dist/$deb: $(du -k "dist/$deb" | cut -f1) KiB, installed $(dpkg-deb -f "dist/$deb" Installed-Size) KiB, built in $((t1 - t0)) s"
if [ "$lint" = 1 ]; then
    if ! command -v lintian >/dev/null; then
        say "lintian missing (scripts/setup.sh installs it)"; exit 2
    fi
    # root: lintian refuses to unpack as root without this
    lintian --allow-root --fail-on error --tag-display-limit 0 "dist/$deb" >&2
    say "lintian: no errors"
fi
echo "dist/$deb"
