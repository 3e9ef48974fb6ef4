# shellcheck shell=sh disable=SC2154
# Sourced by scripts/build-arm64: how the slow, cached parts of the aarch64
# build are made. Everything here is keyed by one hash (see arm64_key): this
# file's text, the compat sources beside it, and the exact versions of the
# Debian packages that go in. A change to any of them makes a new cache
# directory; nothing is ever patched in place.
#
# Under $cache_root/<hash>/:
#   toolchain/        Debian sid amd64 root with `swiftlang` (the compiler).
#                     sid, not trixie: the local copies of swift-log 1.16 and
#                     swift-system 1.8 need Swift >= 6.1 to resolve, trixie
#                     has 6.0.3. amd64, so it runs natively: no emulation.
#   sdk/blecontrol-arm64.artifactbundle/
#                     a Swift SDK bundle (swift-sdk.json, toolset.json) whose
#                     sysroot is Debian 12 bookworm arm64 (glibc 2.36,
#                     libgpiod 1.6: what Raspberry Pi OS is), made without
#                     emulation, plus sid's arm64 Swift runtime of exactly the
#                     compiler's version.
#   run/bookworm, run/trixie
#                     minimal arm64 roots (libc, libstdc++, libdbus) that
#                     `qemu-aarch64-static -L` runs the release binaries in.
#   run/sid-swift     arm64 root with sid's libswiftlang (Foundation, XCTest,
#                     Testing .so files) for the dynamically linked tests.
#   ok                written last: the directory is complete.
#
# Needs: $repo, $cache_root, $mirror; mmdebstrap, apt, dpkg-deb, unshare.

# Packages. The sysroot is what the release binaries are linked against, so
# it is the oldest system supported: bookworm. Its -dev packages ship
# libgpiod.a and libi2c.a, which are linked statically (see arm64_make_sdk),
# so the binaries need neither libgpiod2 (bookworm) nor libgpiod3 (trixie).
# libstdc++-12-dev and libgcc-12-dev: the static Swift runtime is C++ and
# links -lstdc++ (crtbegin, libgcc too); `swiftlang` does not pull them in.
arm64_toolchain_packages="libc6-dev git ca-certificates"
arm64_sysroot_packages="libc6-dev libdbus-1-dev libgpiod-dev libi2c-dev libstdc++-12-dev libgcc-12-dev"
arm64_run_packages="libc6 libstdc++6 libgcc-s1 libdbus-1-3"
arm64_bundle=blecontrol-arm64.artifactbundle
arm64_sdk_id=blecontrol-aarch64-bookworm

# --- Private apt indexes -----------------------------------------------------
# One apt configuration per suite under $cache_root/apt/ (scripts/lib/
# private-apt.sh): the candidate versions (for the hash) and the two arm64
# Swift .debs.
# shellcheck source=scripts/lib/private-apt.sh
. "$repo/scripts/lib/private-apt.sh"
arm64_apt_setup() { # NAME SUITE ARCHS(comma-separated)
    echo "deb [arch=$3 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $2 main" \
        | private_apt "$cache_root/apt/$1" amd64 amd64,arm64
}

arm64_apt() { # NAME apt-command...
    name=$1; shift
    APT_CONFIG=$cache_root/apt/$name/apt.conf "$@"
}

arm64_candidate() { # NAME PACKAGE:ARCH -> version on stdout
    arm64_apt "$1" apt-cache show --no-all-versions "$2" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1
}

# Writes "suite package:arch version" lines for everything that goes into the
# caches, and sets $arm64_swift_version. Fails if the amd64 compiler and the
# arm64 runtime do not have the same version (the .swiftmodule files of the
# runtime can only be read by the compiler that made them).
arm64_versions() { # OUTPUT-FILE
    arm64_apt_setup sid sid amd64,arm64 || return 1
    arm64_apt_setup bookworm bookworm arm64 || return 1
    arm64_apt_setup trixie trixie arm64 || return 1
    : >"$1"
    for entry in sid:swiftlang:amd64 sid:swiftlang:arm64 sid:libswiftlang:arm64 \
        $(for p in $arm64_sysroot_packages $arm64_run_packages; do echo "bookworm:$p:arm64"; done) \
        $(for p in $arm64_run_packages; do echo "trixie:$p:arm64"; done); do
        suite=${entry%%:*}; package=${entry#*:}
        version=$(arm64_candidate "$suite" "$package")
        [ -n "$version" ] || { echo "build-arm64: $package is not in Debian $suite" >&2; return 1; }
        echo "$suite $package $version" >>"$1"
    done
    arm64_swift_version=$(awk '$2 == "swiftlang:amd64" { print $3 }' "$1")
    arm64_swift_arm64=$(awk '$2 == "swiftlang:arm64" { print $3 }' "$1")
    if [ "$arm64_swift_version" != "$arm64_swift_arm64" ]; then
        echo "build-arm64: sid has swiftlang $arm64_swift_version for amd64 but $arm64_swift_arm64 for arm64;" \
            "the runtime must match the compiler exactly: wait for sid's arm64 build" >&2
        return 1
    fi
}

arm64_key() { # VERSIONS-FILE -> hash on stdout
    here=$repo/scripts/arm64
    cat "$here/sdk.sh" "$here/glibc-compat.c" "$here/libstdcxx-compat.cc" "$1" | sha256sum | cut -c1-16
}

# --- Running things in the toolchain root ------------------------------------
# The toolchain root is entered with chroot in a private mount namespace
# (unshare): its mounts (proc, dev, the package, the SDK, the package copies)
# vanish when the command ends, however it ends; nothing is left mounted.
# The package and the SDK are mounted at the SAME absolute paths as outside,
# so every path the build writes (#filePath in the tests, the SDK paths in
# SwiftPM's build description) is valid outside the chroot as well.
# Dependencies: git inside resolves https://github.com/ through the host's
# url.<base>.insteadOf rules (the local package copies in /opt/swift-packages
# on this rig), given to it as its /etc/gitconfig for this command only.
#
# Usage: arm64_chroot ROOT SDK-DIR ro|rw EXTRA-DIR CMD...
#   EXTRA-DIR: another writable directory to mount (the scratch path when it
#   is outside the package), or "" for none.
arm64_chroot() {
    root=$1 sdk=$2 mode=$3 extra=$4; shift 4
    gitconfig=$cache_root/gitconfig.$$
    { echo '[safe]'; echo '	directory = *'
      if command -v git >/dev/null 2>&1; then
          git config --get-regexp '^url\..*\.insteadof$' 2>/dev/null | while read -r key value; do
              base=${key#url.}; base=${base%.insteadof}
              printf '[url "%s"]\n\tinsteadOf = %s\n' "$base" "$value"
          done
      fi; } >"$gitconfig"
    status=0
    unshare --mount --propagation private -- sh -eu -c '
        root=$1 repo=$2 sdk=$3 mode=$4 extra=$5 gitconfig=$6; shift 6
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        for dir in "$repo" "$sdk" $extra; do
            mkdir -p "$root$dir"
            mount --bind "$dir" "$root$dir"
        done
        [ "$mode" = rw ] || mount -o remount,bind,ro "$root$sdk"
        if [ -d /opt/swift-packages ]; then
            mkdir -p "$root/opt/swift-packages"
            mount --bind /opt/swift-packages "$root/opt/swift-packages"
            mount -o remount,bind,ro "$root/opt/swift-packages"
        fi
        touch "$root/etc/gitconfig"
        mount --bind "$gitconfig" "$root/etc/gitconfig"
        exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
            PATH=/usr/libexec/swift/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
    ' sh "$root" "$repo" "$sdk" "$mode" "$extra" "$gitconfig" "$@" || status=$?
    rm -f "$gitconfig"
    return $status
}

# --- Making the cache ----------------------------------------------------------
# CMD runs as a plain command, never in an `||` or `if`: there the shell
# would ignore set -e inside it and carry on after a failed step.
arm64_timed() { # LABEL CMD...: runs CMD, prints and records how long it took
    label=$1; shift
    t0=$(date +%s)
    "$@"
    t=$(( $(date +%s) - t0 ))
    printf 'build-arm64: %-34s %4ss\n' "$label" "$t"
    arm64_times="$arm64_times$(printf '%-34s %5ss' "$label" "$t")
"
}

# sid moves several times a day, and a mirror being synced may fail a
# download for a while: one more try a minute on, into an emptied target
# (always inside the cache's .tmp). (The "apt download failed" that first
# looked like that, in ci20 and ci21, was descriptors scripts/test had
# left open; see there.)
arm64_mmdebstrap() { # OPTIONS... SUITE TARGET MIRROR, as mmdebstrap takes them
    eval "target=\${$(($# - 1))}"
    case $target in "$cache_root"/*.tmp/*) ;; *) echo "build-arm64: refusing to retry into $target" >&2; return 1 ;; esac
    mmdebstrap "$@" && return 0
    echo "build-arm64: mmdebstrap failed (above); once more in 60 s" >&2
    sleep 60
    rm -rf "$target"
    mmdebstrap "$@"
}

arm64_make_toolchain() { # DIR
    # --variant=apt: dpkg + apt + swiftlang's own dependencies (binutils, gcc,
    # libswiftlang). libc6-dev: SwiftPM links each Package.swift natively,
    # and gcc only recommends it. git: SwiftPM clones the dependencies.
    arm64_mmdebstrap --quiet --variant=apt --mode=root \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --include="swiftlang=$arm64_swift_version,$(echo $arm64_toolchain_packages | tr ' ' ,)" \
        sid "$1" "$mirror"
}

# Only what a cross build reads from sid's arm64 `swiftlang` (2.6 GB
# installed): the Swift modules, shims and static runtime (lib/swift,
# lib/swift_static, not the embedded-Swift or compiler-plugin parts) and
# clang's builtin headers; from `libswiftlang` the runtime .so files that the
# tests link. Put where a Swift SDK looks: <sysroot>/usr/lib/swift{,_static}.
arm64_extract_runtime() { # SYSROOT WORK
    sysroot=$1 work=$2
    mkdir -p "$work/debs" "$work/x"
    (cd "$work/debs" && arm64_apt sid apt-get -q -q download \
        "swiftlang:arm64=$arm64_swift_version" "libswiftlang:arm64=$arm64_swift_version")
    lib=./usr/libexec/swift/lib
    dpkg-deb --fsys-tarfile "$work"/debs/swiftlang_*_arm64.deb | tar -x -C "$work/x" --wildcards \
        --exclude="$lib/swift/embedded" --exclude="$lib/swift_static/embedded" \
        --exclude="$lib/swift/host" --exclude="$lib/swift/FrameworkABIBaseline" \
        --exclude="$lib/swift/migrator" --exclude="$lib/swift/pm" \
        "$lib/swift/*" "$lib/swift_static/*" "$lib/clang/*/include/*"
    dpkg-deb --fsys-tarfile "$work"/debs/libswiftlang_*_arm64.deb | tar -x -C "$work/x" --wildcards \
        "$lib/swift/linux/*"
    # lib/swift/clang and lib/swift_static/clang are relative links to
    # ../clang/<version>: they keep working after the move.
    mv "$work/x/usr/libexec/swift/lib/swift" "$work/x/usr/libexec/swift/lib/swift_static" \
        "$work/x/usr/libexec/swift/lib/clang" "$sysroot/usr/lib/"
    rm -rf "$work/debs" "$work/x"
}

arm64_make_sdk() { # DIR TOOLCHAIN-ROOT
    bundle=$1/$arm64_bundle
    sysroot=$bundle/bookworm/sysroot
    mkdir -p "$bundle/bookworm"
    # --variant=extract: the packages and their dependencies are unpacked,
    # no maintainer script runs, so no arm64 code runs and no qemu is needed.
    arm64_mmdebstrap --quiet --variant=extract --mode=root --architectures=arm64 \
        --include="$(echo $arm64_sysroot_packages | tr ' ' ,)" bookworm "$sysroot" "$mirror"

    # bookworm's -dev links are absolute (libm.so -> /lib/aarch64-linux-gnu/
    # libm.so.6): seen from the host they dangle, and the linker then falls
    # back to the .a beside them, silently linking libm and libdbus
    # statically. Make every absolute link relative, inside the sysroot.
    find "$sysroot" -path "$sysroot/dev" -prune -o -type l -print | while read -r link; do
        target=$(readlink "$link")
        case $target in /*) ln -sfnr "$sysroot$target" "$link" ;; esac
    done
    # No libgpiod.so/libi2c.so development links: `-lgpiod`/`-li2c` (from
    # Package.swift) then find libgpiod.a/libi2c.a, and the binaries carry
    # libgpiod 1.6 themselves: no libgpiod2 | libgpiod3 dependency.
    rm -f "$sysroot/usr/lib/aarch64-linux-gnu/libgpiod.so" "$sysroot/usr/lib/aarch64-linux-gnu/libgpiodcxx.so" \
        "$sysroot/usr/lib/aarch64-linux-gnu/libi2c.so"

    arm64_extract_runtime "$sysroot" "$1/work"

    # Debian's libswiftlang ships no lib_Testing_Foundation.so, yet swiftlang
    # declares the Testing+Foundation cross-import overlay: any test target
    # importing both then fails to link (-l_Testing_Foundation). The overlay
    # only adds attachment helpers, which the tests do not use: drop it.
    rm -rf "$sysroot/usr/lib/swift/linux/Testing.swiftcrossimport" \
        "$sysroot/usr/lib/swift/linux/_Testing_Foundation.swiftmodule"

    # The static runtime was compiled against sid's glibc 2.42 and GCC 15
    # headers and references a few symbols bookworm's glibc 2.36 and
    # libstdc++ (GCC 12) do not have (__isoc23_strtol & co., strlcpy,
    # strlcat: glibc 2.38; std::ios_base_library_init: GCC 13). A small
    # archive defines them with what 2.36 has, compiled against the sysroot
    # by the toolchain's clang, and linked after the static runtime through
    # static-stdlib-args.lnk (which --static-swift-stdlib reads): only
    # static links get it. The check in build-arm64 proves the result asks
    # for nothing newer than GLIBC_2.36 / GLIBCXX_3.4.30.
    static=$sysroot/usr/lib/swift_static/linux
    arm64_chroot "$2" "$1" rw "" sh -eu -c '
        sysroot=$1 out=$2 src=$3
        cd "$(mktemp -d)"
        clang --target=aarch64-unknown-linux-gnu --sysroot="$sysroot" -O2 -fPIC -Wall -Werror -c "$src/glibc-compat.c"
        clang++ --target=aarch64-unknown-linux-gnu --sysroot="$sysroot" -O2 -fPIC -Wall -Werror -c "$src/libstdcxx-compat.cc"
        llvm-ar rcs "$out/libblecontrol-compat.a" glibc-compat.o libstdcxx-compat.o
    ' sh "$sysroot" "$static" "$repo/scripts/arm64"
    printf '\n-lblecontrol-compat\n' >>"$static/static-stdlib-args.lnk"

    cat >"$bundle/info.json" <<EOF
{
  "schemaVersion": "1.0",
  "artifacts": {
    "$arm64_sdk_id": {
      "type": "swiftSDK",
      "version": "$arm64_swift_version",
      "variants": [{ "path": "bookworm" }]
    }
  }
}
EOF
    cat >"$bundle/bookworm/swift-sdk.json" <<'EOF'
{
  "schemaVersion": "4.0",
  "targetTriples": {
    "aarch64-unknown-linux-gnu": {
      "sdkRootPath": "sysroot",
      "swiftResourcesPath": "sysroot/usr/lib/swift",
      "swiftStaticResourcesPath": "sysroot/usr/lib/swift_static",
      "toolsetPaths": ["toolset.json"]
    }
  }
}
EOF
    # lld (ld.lld, shipped in swiftlang) links any target; Debian sid's
    # binutils has no gold any more and its ld.bfd is x86-only.
    cat >"$bundle/bookworm/toolset.json" <<'EOF'
{
  "schemaVersion": "1.0",
  "swiftCompiler": { "extraCLIOptions": ["-use-ld=lld"] }
}
EOF
}

# The extract variant does not create the merged-/usr links that trixie and
# sid expect (/lib -> usr/lib, where the ELF interpreter path points).
arm64_merge_usr() { # ROOT
    for d in bin sbin lib; do
        [ -e "$1/$d" ] || [ -L "$1/$d" ] || ln -s "usr/$d" "$1/$d"
    done
}

arm64_make_run_root() { # DIR SUITE PACKAGES...
    dir=$1 suite=$2; shift 2
    mkdir -p "$dir"
    arm64_mmdebstrap --quiet --variant=extract --mode=root --architectures=arm64 \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --include="$(echo "$@" | tr ' ' ,)" "$suite" "$dir" "$mirror"
    arm64_merge_usr "$dir"
}

# The extract variant runs no maintainer script and so no ldconfig trigger:
# a library whose package ships only its versioned file (sid's
# libpicohttpparser.so.1.2, which libmosquitto.so.1 needs) has no link by
# its SONAME, the name the loader looks for. readelf reads arm64 ELF here.
arm64_soname_links() { # ROOT
    for lib in "$1"/usr/lib/aarch64-linux-gnu/*.so.*; do
        if [ -L "$lib" ] || [ ! -f "$lib" ]; then continue; fi
        soname=$(readelf -d "$lib" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
        if [ -n "$soname" ] && [ ! -e "${lib%/*}/$soname" ]; then
            ln -s "${lib##*/}" "${lib%/*}/$soname"
        fi
    done
}

arm64_make_run_roots() { # DIR
    arm64_make_run_root "$1/bookworm" bookworm $arm64_run_packages
    arm64_make_run_root "$1/trixie" trixie $arm64_run_packages
    # libmosquitto1: the library the daemon opens for transports.mqtt, so
    # the MQTT suites run on arm64 too (the broker and its clients are the
    # host's own, run natively).
    arm64_make_run_root "$1/sid-swift" sid "libswiftlang=$arm64_swift_version" libdbus-1-3 libmosquitto1
    arm64_soname_links "$1/sid-swift"
}

# Makes $cache_root/<hash> if it is not complete yet; sets $arm64_dir.
arm64_ensure_cache() { # HASH
    arm64_dir=$cache_root/$1
    if [ -f "$arm64_dir/ok" ]; then
        echo "build-arm64: cache $arm64_dir (Swift $arm64_swift_version)"
        return 0
    fi
    tmp=$arm64_dir.tmp
    # A half-made directory from an interrupted run: its mounts were private
    # to the process that died, so nothing of it is mounted any more.
    rm -rf "$tmp"
    mkdir -p "$tmp"
    echo "build-arm64: making $arm64_dir (Swift $arm64_swift_version; a few minutes)"
    arm64_timed "toolchain root (sid amd64)" arm64_make_toolchain "$tmp/toolchain"
    arm64_timed "SDK (bookworm arm64 sysroot)" arm64_make_sdk "$tmp/sdk" "$tmp/toolchain"
    arm64_timed "run roots (bookworm/trixie/sid)" arm64_make_run_roots "$tmp/run"
    cp "$cache_root/versions.new" "$tmp/versions"
    touch "$tmp/ok"
    mv "$tmp" "$arm64_dir"
    # Keep one generation: each is about 3.5 GB.
    for old in "$cache_root"/*; do
        [ -d "$old" ] || continue
        case ${old##*/} in apt|"$1") ;; *) rm -rf "$old" ;; esac
    done
}
