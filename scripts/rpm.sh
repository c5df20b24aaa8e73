#!/usr/bin/env bash
# Build the ferry RPM from packaging/ferry.spec (what `make rpm` runs).
#
#   scripts/rpm.sh [-o OUTDIR] [-b BINARY]
#
#   -o OUTDIR   where the .rpm goes (default: dist/); its path is printed
#   -b BINARY   package this prebuilt linux binary instead of building one
#               (its version must match: it is not checked)
#
#   GOARCH      architecture to build for (default: go env GOARCH)
#
#   scripts/rpm.sh --rpm-version DESCRIBE [COUNT]
#               print the RPM Version and Release for a `git describe`
#               output (COUNT: commits in HEAD, for untagged trees)
#
# Needs: go, git, rpmbuild (Debian: apt-get install rpm).
set -euo pipefail
export GOFLAGS=${GOFLAGS:--tags=containers_image_openpgp}

# rpm_version DESCRIBE COUNT prints "VERSION RELEASE". RPM forbids '-' in
# both; the git version stays whole in `ferry version`.
#   v1.2.3                  -> 1.2.3 1
#   v1.2.3-4-gabc1234       -> 1.2.3 1.4.gabc1234        (after the tag)
#   v1.2.3-rc1              -> 1.2.3~rc1 1               (sorts before 1.2.3)
#   abc1234 (no tag)        -> 0.0.0 0.COUNT.gabc1234    (grows with history)
#   ...-dirty               -> release gets .dirty
rpm_version() {
	local d=$1 count=${2:-0} dirty="" v r
	if [[ $d == *-dirty ]]; then
		dirty=.dirty
		d=${d%-dirty}
	fi
	if [[ $d =~ ^[0-9a-f]{7,40}$ ]]; then
		v=0.0.0
		r="0.${count}.g${d}"
	elif [[ $d =~ ^v?([0-9][0-9A-Za-z.]*)(-(rc|alpha|beta)\.?([0-9]+))?(-([0-9]+)-g([0-9a-f]+))?$ ]]; then
		v=${BASH_REMATCH[1]}
		[[ -n ${BASH_REMATCH[3]} ]] && v+="~${BASH_REMATCH[3]}${BASH_REMATCH[4]}"
		if [[ -n ${BASH_REMATCH[6]} ]]; then
			r="1.${BASH_REMATCH[6]}.g${BASH_REMATCH[7]}"
		else
			r=1
		fi
	else
		# Anything else: keep what RPM allows, dashes become dots.
		v=$(printf '%s' "${d#v}" | tr -c 'A-Za-z0-9._+~^' '.')
		r=1
	fi
	printf '%s %s\n' "$v" "$r$dirty"
}

if [[ ${1:-} == --rpm-version ]]; then
	rpm_version "${2:?git describe output}" "${3:-0}"
	exit 0
fi

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/dist
binary=""
while getopts "o:b:" opt; do
	case $opt in
	o) out=$OPTARG ;;
	b) binary=$OPTARG ;;
	*) echo "usage: $0 [-o OUTDIR] [-b BINARY]" >&2; exit 2 ;;
	esac
done

for tool in go git rpmbuild; do
	command -v "$tool" >/dev/null || { echo "rpm.sh: $tool not found (Debian: apt-get install rpm; or run test/setup/install-deps.sh)" >&2; exit 1; }
done

goarch=${GOARCH:-$(go env GOARCH)}
case $goarch in
amd64) rpmarch=x86_64 ;;
arm64) rpmarch=aarch64 ;;
ppc64le | s390x) rpmarch=$goarch ;;
*) echo "rpm.sh: GOARCH $goarch: no OpenShift nodes of that arch" >&2; exit 2 ;;
esac

describe=$(git -C "$root" describe --tags --always --dirty --match 'v[0-9]*')
count=$(git -C "$root" rev-list --count HEAD)
read -r version release < <(rpm_version "$describe" "$count")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{SOURCES,BUILD,RPMS,SRPMS,SPECS,BUILDROOT} "$out"
src=$work/SOURCES

ldflags="-s -w -X main.version=$describe"
if [[ -n $binary ]]; then
	install -m 0755 "$binary" "$src/ferry"
else
	(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=$goarch go build -trimpath -ldflags "$ldflags" -o "$src/ferry" ./cmd/ferry)
fi
# Completions come from the command tree; generate them with a binary that
# runs here.
host=$src/ferry
if [[ $goarch != "$(go env GOHOSTARCH)" || -n $binary ]]; then
	host=$work/ferry-host
	(cd "$root" && CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$host" ./cmd/ferry)
fi
"$host" completion bash >"$src/ferry.bash"
"$host" completion zsh >"$src/_ferry"
"$host" completion fish >"$src/ferry.fish"

cp "$root"/packaging/{ferry.service,ferry.slice,ferry.preset,config.toml} "$src/"
cp "$root"/docs/{technician,engineer,admin,troubleshooting}.md "$src/"

rpmbuild -bb --quiet \
	--define "_topdir $work" \
	--define "ferry_version $version" \
	--define "ferry_release $release" \
	--target "$rpmarch" \
	"$root/packaging/ferry.spec" >&2

rpm=$(find "$work/RPMS" -name '*.rpm' -print -quit)
cp "$rpm" "$out/"
echo "$out/$(basename "$rpm")"
