"""The Debian 13 root Home Assistant runs in, cached by a hash of its
inputs, and the commands that run things in it.

Home Assistant 2026.2.3 needs Python 3.13 (Debian 13's; Debian 12's 3.11 is
too old, and 2026.3 wants 3.14): a trixie root made with mmdebstrap, with a
venv at /opt/ha holding Tests/HomeAssistant/requirements.txt (every
package pinned: Home Assistant, the requirements of what the tier makes it
load, and theirs), installed once, here, never by Home Assistant during a
run. The root's key is the hash of the two recipes below, the archive's
candidate versions of the root's Debian packages, and requirements.txt:
change any of them and the next run makes the root again (about 5 minutes
of mmdebstrap and 3 of pip here); one generation is kept.

Commands run in it with chroot, in a private mount namespace: /proc, /sys
(read-only), /dev, a fresh /tmp, the tier's directory (read-only, at
/tier) and Home Assistant's configuration directory (at /config). The
mounts go when the command's process ends. No PID namespace: the process
the rig starts is the command itself, which it signals directly (SIGTERM
is Home Assistant's own clean stop). The root shares the host's network:
Home Assistant there reaches the host's Mosquitto on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts/lib"))
import rig  # noqa: E402

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
VERSION = "2026.2.3"
"""Home Assistant's version: the newest that Python 3.13 runs."""
VENV = "/opt/ha"

# >>> root recipe: these lines (with the package versions and requirements.txt) key the cached root
# python3-venv: the venv Home Assistant lives in, apart from Debian's python3.
# gcc, g++, python3-dev, libc6-dev: lru-dict 1.3.0 (C), pymicro-vad 1.0.1 and
#   pyspeex-noise 1.0.2 (C++; the assist pipeline's, which the service
#   descriptions import) have no wheel for Python 3.13; pip builds them.
# ca-certificates: pip's HTTPS (the host's own bundle is added when it
#   builds the venv: a CI behind a TLS proxy trusts that one).
# tzdata: Home Assistant's time zone (UTC here) through zoneinfo.
# libturbojpeg0: the camera component (the frontend's service descriptions
#   load it) logs an error without it.
ROOT_PACKAGES = "python3 python3-venv python3-dev gcc g++ libc6-dev ca-certificates tzdata libturbojpeg0"
MAKE_ROOT = r'''
mmdebstrap --quiet --variant=apt --mode=root \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$(echo "$packages" | tr ' ' ,)" trixie "$root" "$mirror"
'''
# Every package exactly as pinned, no dependency resolved here (--no-deps):
# `pip check` proves the set is complete and consistent, and the dry run
# with Home Assistant's own package_constraints.txt that it keeps to them.
MAKE_VENV = r'''
python3 -m venv /opt/ha
/opt/ha/bin/pip install --quiet --no-cache-dir --no-deps -r /tier/requirements.txt
/opt/ha/bin/pip check
/opt/ha/bin/pip install --quiet --no-cache-dir --no-deps --dry-run -r /tier/requirements.txt \
    -c /opt/ha/lib/python3.13/site-packages/homeassistant/package_constraints.txt
/opt/ha/bin/python -m homeassistant --version
'''
# <<< root recipe

IN_ROOT = r'''
root=$1 tier=$2 config=$3 certs=$4; shift 4
mount -t proc proc "$root/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
touch "$root/etc/resolv.conf"
mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/tier" "$root/config"
mount --bind "$tier" "$root/tier"
mount -o remount,bind,ro "$root/tier"
[ -z "$config" ] || mount --bind "$config" "$root/config"
if [ -n "$certs" ]; then
    touch "$root/tmp/host-ca.crt"
    mount --bind "$certs" "$root/tmp/host-ca.crt"
fi
exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TZ=UTC \
    PATH=/opt/ha/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
'''

HOST_CERTS = Path("/etc/ssl/certs/ca-certificates.crt")


class Root:
    """$cache/root-KEY/{root/,versions,ok}; $cache/lock-KEY for --lock."""

    def __init__(self, cache: Path, mirror: str, steps: rig.Steps) -> None:
        self.cache = cache
        self.mirror = mirror
        self.steps = steps
        self.path = Path()

    def command(self, *cmd: str, config: "Path | None" = None, env: "dict[str, str] | None" = None,
                root: "Path | None" = None, certs: bool = False) -> list[str]:
        """The command line that runs cmd in the root (env: more variables)."""
        pairs = [f"{name}={value}" for name, value in (env or {}).items()]
        if certs and HOST_CERTS.is_file():
            pairs += ["PIP_CERT=/tmp/host-ca.crt", "SSL_CERT_FILE=/tmp/host-ca.crt"]
        return ["unshare", "--mount", "--propagation", "private", "--",
                "sh", "-eu", "-c", IN_ROOT, "sh", str(root or self.path / "root"), str(HERE),
                str(config or ""), str(HOST_CERTS) if certs and HOST_CERTS.is_file() else "",
                "PIP_DISABLE_PIP_VERSION_CHECK=1", *pairs, *cmd]

    def versions(self) -> "str | None":
        """The archive's candidate versions of the root's packages; None
        when the archive cannot be read."""
        arch = rig.output(["dpkg", "--print-architecture"])
        try:
            env = rig.private_apt(self.cache / "apt", arch, arch,
                                  f"deb [arch={arch} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
                                  f" {self.mirror} trixie main\n")
        except rig.Failure as failure:
            self.steps.say(f"cannot read trixie's package indexes: {rig.last_lines(str(failure), 1)}")
            return None
        return rig.candidate_versions(env, ROOT_PACKAGES.split())

    def recipe(self) -> str:
        text = Path(__file__).read_text()
        return text[text.index("# >>> root recipe"):text.index("# <<< root recipe")]

    def ensure(self, *, refresh: bool = False) -> str:
        """The root for the current recipe, versions and requirements, made
        when missing: what it was ("cached" or "made in N s")."""
        versions = self.versions()
        current = self.cache / "current"
        if versions is None:
            key = current.read_text().strip() if current.is_file() else ""
            if not key or not (self.cache / f"root-{key}/ok").is_file():
                rig.die("cannot read trixie's package indexes and no root is cached")
            self.steps.say(f"using the cached root {key} (the archive could not be read)")
        else:
            key = rig.digest(self.recipe(), versions, REQUIREMENTS.read_bytes())
        self.path = self.cache / f"root-{key}"
        if refresh:
            rig.remove(self.path)
        if (self.path / "ok").is_file():
            current.write_text(f"{key}\n")
            return "cached"
        started = time.monotonic()
        # A half-made root of an interrupted run: its mounts were private to a
        # namespace that is gone, so nothing in it is mounted.
        rig.remove(self.path)
        self.path.mkdir(parents=True)
        log = self.path / "make.log"
        self.steps(f"making the trixie root {self.path} (mmdebstrap, then pip; minutes)")
        if rig.run_logged(["sh", "-euc", MAKE_ROOT, "sh"], log,
                          env={**os.environ, "packages": ROOT_PACKAGES,
                               "root": str(self.path / "root"), "mirror": self.mirror}) != 0:
            rig.die(f"mmdebstrap failed:\n{rig.last_lines(log.read_text(errors='replace'), 20, chr(10))}")
        self.steps(f"Home Assistant {VERSION} and its requirements into {VENV} (pip)")
        if rig.run_logged(self.command("sh", "-euc", MAKE_VENV, certs=True), log) != 0:
            rig.die(f"the venv failed:\n{rig.last_lines(log.read_text(errors='replace'), 20, chr(10))}")
        (self.path / "versions").write_text(versions or "")
        (self.path / "ok").touch()
        current.write_text(f"{key}\n")
        for old in self.cache.glob("root-*"):
            if old != self.path:
                shutil.rmtree(old, ignore_errors=True)
        return f"made in {int(time.monotonic() - started)} s"

    def lock(self) -> str:
        """requirements.txt made anew: Home Assistant VERSION and what
        integrations.py lists, resolved by pip under Home Assistant's own
        package_constraints.txt (read from its wheel), frozen. In a root of
        the same Debian packages without the venv ($cache/lock-KEY)."""
        versions = self.versions()
        if versions is None:
            rig.die("--lock needs the archive")
        key = rig.digest(self.recipe(), versions)
        path = self.cache / f"lock-{key}"
        root = path / "root"
        if not (path / "ok").is_file():
            rig.remove(path)
            path.mkdir(parents=True)
            self.steps(f"making the trixie root {path} (mmdebstrap)")
            rig.run(["sh", "-euc", MAKE_ROOT, "sh"], log=path / "make.log",
                    env={**os.environ, "packages": ROOT_PACKAGES,
                         "root": str(root), "mirror": self.mirror})
            (path / "ok").touch()
        for old in self.cache.glob("lock-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        self.steps(f"resolving homeassistant=={VERSION} and the integrations' requirements (pip)")
        script = r'''
            rm -rf /var/tmp/lock && mkdir -p /var/tmp/lock && cd /var/tmp/lock
            python3 -m venv venv
            venv/bin/pip download --quiet --no-deps --dest wheel "homeassistant==$1"
            venv/bin/python -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read("homeassistant/package_constraints.txt").decode())' wheel/homeassistant-*.whl > constraints.txt
            venv/bin/pip install --quiet --no-cache-dir -c constraints.txt "homeassistant==$1"
            venv/bin/python /tier/integrations.py > integrations.txt
            sed 's/ *#.*//' integrations.txt > wanted.txt
            venv/bin/pip install --quiet --no-cache-dir -c constraints.txt -r wanted.txt
            venv/bin/pip check >&2
            { cat integrations.txt; echo; venv/bin/pip freeze; } > lock.txt
        '''
        rig.run(self.command("sh", "-euc", script, "sh", VERSION, root=root, certs=True), log=path / "lock.log")
        lines = (root / "var/tmp/lock/lock.txt").read_text().split("\n\n", 1)
        wanted, frozen = lines[0].splitlines(), lines[1]
        header = [
            f"# Home Assistant {VERSION} in the Home Assistant tier's root (Tests/HomeAssistant/haroot.py):",
            "# every package pinned, installed with --no-deps. Made by `Tests/HomeAssistant/run --lock`:",
            "# pip resolved homeassistant and the requirements below (integrations.py: what the tier",
            "# makes Home Assistant load, with the integration that wants each) under Home Assistant's",
            "# own package_constraints.txt, then froze the result. Edit VERSION in haroot.py, not this.",
            *(f"#   {line}" for line in wanted),
        ]
        REQUIREMENTS.write_text("\n".join(header) + "\n" + frozen)
        shutil.rmtree(root / "var/tmp/lock", ignore_errors=True)
        return f"{len(frozen.splitlines())} packages pinned in {REQUIREMENTS.relative_to(rig.REPO)}"
