#if canImport(Glibc)
import Glibc
#endif
import LinuxHardware
import Reactor

/// Read-only facts about the machine for `blecontrol doctor`: processes,
/// sysfs, users and device nodes. Kernel trees (`/proc`, `/sys`, `/boot`) and
/// configuration files are looked up under ``root``, GPIO chips through
/// ``gpio`` and programs are run through ``run``, so tests can hand it a
/// made-up machine (and see what would be executed); users and groups come
/// from the name service, device nodes from their real paths.
public struct SystemInspector: Sendable {
    /// Runs a program with arguments and returns its output, nil when it
    /// cannot be run or does not finish in time.
    public typealias ProgramRunner = @Sendable (_ executable: String, _ arguments: [String]) -> String?

    /// Where `/proc`, `/sys`, `/boot` and `/etc` are looked up ("/" normally).
    public var root: String
    /// The GPIO chips and their lines (libgpiod on /dev normally).
    public var gpio: any GPIOChipCatalog
    /// How programs are run (``Subprocess`` normally, with a 3 s bound).
    public var run: ProgramRunner

    public init(root: String = "/", gpio: any GPIOChipCatalog = SystemGPIOChips(), run: @escaping ProgramRunner = { Subprocess.output(of: $0, $1) }) {
        self.root = root
        self.gpio = gpio
        self.run = run
    }

    /// `path` (absolute) under ``root``.
    public func path(_ path: String) -> String {
        if root == "/" || root.isEmpty { return path }
        return (root.hasSuffix("/") ? String(root.dropLast()) : root) + path
    }

    /// The file's text without surrounding white space, nil if unreadable
    /// or larger than `limit` bytes.
    public func read(_ absolutePath: String, limit: Int = 1 << 20) -> String? {
        Files.text(path(absolutePath), limit: limit)?.trimmed
    }

    public func exists(_ absolutePath: String) -> Bool {
        Files.exists(path(absolutePath))
    }

    /// Directory entries, sorted; empty when the directory is missing.
    public func list(_ absolutePath: String) -> [String] {
        Files.list(path(absolutePath))
    }

    // MARK: Processes

    /// A process and the user it runs as.
    public struct RunningProcess: Sendable, Equatable {
        public var pid: Int32
        /// The real and the effective user id (`/proc/PID/status`'s `Uid:`
        /// line), nil when it could not be read.
        public var uids: (real: UInt32, effective: UInt32)?

        /// Started by root and running as root: a process no other user can
        /// have started or taken over (a setuid program started by someone
        /// else keeps that someone as its real user).
        public var isRoot: Bool { uids.map { $0.real == 0 && $0.effective == 0 } ?? false }

        public static func == (lhs: Self, rhs: Self) -> Bool {
            lhs.pid == rhs.pid && lhs.uids?.real == rhs.uids?.real && lhs.uids?.effective == rhs.uids?.effective
        }
    }

    /// The processes whose `/proc/PID/comm` is `name`, by pid (the kernel
    /// truncates comm to 15 bytes, which "bluetoothd" fits). Any user can
    /// give a process any name: only ``RunningProcess/isRoot`` says it is
    /// the system's.
    public func processes(named name: String) -> [RunningProcess] {
        list("/proc").compactMap { entry -> RunningProcess? in
            guard let pid = Int32(entry), read("/proc/\(entry)/comm") == name else { return nil }
            return RunningProcess(pid: pid, uids: processUIDs(pid))
        }.sorted { $0.pid < $1.pid }
    }

    /// From the `Uid:` line of `/proc/PID/status` (proc(5): real, effective,
    /// saved, file system). Not the owner of `/proc/PID`: the kernel makes
    /// that root for any process that is not dumpable, which a process can
    /// make itself with one prctl.
    private func processUIDs(_ pid: Int32) -> (real: UInt32, effective: UInt32)? {
        guard let status = read("/proc/\(pid)/status") else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("Uid:") {
            let ids = line.dropFirst(4).split(whereSeparator: { $0 == " " || $0 == "\t" }).compactMap { UInt32($0) }
            return ids.count >= 2 ? (ids[0], ids[1]) : nil
        }
        return nil
    }

    /// Why running the program at `absolutePath` (under ``root``) could run
    /// something root did not put there, nil when it could not: the file
    /// and every directory above it must be owned by root, writable by
    /// nobody else, and none of them a symbolic link (whose target would
    /// need the same checks).
    public func untrustedExecutable(_ absolutePath: String) -> String? {
        let components = absolutePath.split(separator: "/").map(String.init)
        var current = ""
        for (index, component) in ([""] + components).enumerated() {
            if index > 0 { current += "/" + component }
            var info = stat()
            let shown = current.isEmpty ? "/" : current
            guard lstat(path(shown), &info) == 0 else { return "\(shown) does not exist" }
            let type = info.st_mode & S_IFMT
            if type == S_IFLNK { return "\(shown) is a symbolic link" }
            if index == components.count ? type != S_IFREG : type != S_IFDIR { return "\(shown) is not a \(index == components.count ? "file" : "directory")" }
            if info.st_uid != 0 { return "\(shown) belongs to \(Self.userName(info.st_uid)), not root" }
            if info.st_mode & 0o022 != 0 { return "\(shown) is writable by others than root (mode \(String(info.st_mode & 0o7777, radix: 8)))" }
        }
        return nil
    }

    // MARK: Bluetooth

    /// One rfkill switch of type bluetooth.
    public struct RfkillSwitch: Sendable, Equatable {
        public var name: String
        public var softBlocked: Bool
        public var hardBlocked: Bool
    }

    /// The `hciN` adapters the kernel knows (`/sys/class/bluetooth`).
    public func bluetoothAdapters() -> [String] {
        list("/sys/class/bluetooth").filter { $0.hasPrefix("hci") && !$0.contains(":") }
    }

    /// The rfkill switches of `adapter` (its `rfkillN` child in sysfs), else
    /// every switch of type bluetooth: a platform switch blocks all adapters.
    public func rfkillSwitches(for adapter: String) -> [RfkillSwitch] {
        let own = list("/sys/class/bluetooth/\(adapter)").filter { $0.hasPrefix("rfkill") }
        let candidates = own.isEmpty
            ? list("/sys/class/rfkill").filter { read("/sys/class/rfkill/\($0)/type") == "bluetooth" }.map { "/sys/class/rfkill/\($0)" }
            : own.map { "/sys/class/bluetooth/\(adapter)/\($0)" }
        return candidates.map { directory in
            RfkillSwitch(
                name: read("\(directory)/name") ?? String(directory.split(separator: "/").last ?? ""),
                softBlocked: read("\(directory)/soft") == "1",
                hardBlocked: read("\(directory)/hard") == "1"
            )
        }
    }

    // MARK: Raspberry Pi

    /// "Raspberry Pi 4 Model B Rev 1.4", or nil on other machines.
    public func raspberryPiModel() -> String? {
        guard let model = read("/proc/device-tree/model").map({ String($0.filter { $0 != "\0" }) }),
              model.contains("Raspberry Pi") else { return nil }
        return model
    }

    /// The Pi's config.txt (bookworm and later keep it in /boot/firmware).
    public func configTxtPath() -> String? {
        ["/boot/firmware/config.txt", "/boot/config.txt"].first { exists($0) }
    }

    /// config.txt's active settings: each line without its comment and
    /// spaces (`dtparam=i2c_arm=on`), empty lines left out.
    public func configTxtSettings(_ configPath: String) -> [String] {
        guard let text = read(configPath) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let setting = line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let compact = String(setting.filter { $0 != " " && $0 != "\t" && $0 != "\r" })
            return compact.isEmpty ? nil : compact
        }
    }

    /// Whether config.txt has an active line enabling the header's I2C bus.
    public func configTxtEnablesI2C(_ configPath: String) -> Bool {
        configTxtSettings(configPath).contains { compact in
            // dtparam=i2c_arm=on, also as dtparam=i2c=on or in a list
            // (dtparam=audio=on,i2c_arm=on).
            guard compact.hasPrefix("dtparam=") else { return false }
            return compact.dropFirst("dtparam=".count).split(separator: ",").contains { parameter in
                ["i2c_arm=on", "i2c=on", "i2c1=on", "i2c_arm", "i2c"].contains(String(parameter))
            }
        }
    }

    /// The Pi's kernel command line file, next to config.txt.
    public func cmdlineTxtPath() -> String? {
        ["/boot/firmware/cmdline.txt", "/boot/cmdline.txt"].first { exists($0) }
    }

    /// Whether this is a Raspberry Pi 5: its header's GPIO and I2C are on
    /// the RP1 chip, not on the SoC as on the Pi 3 and 4.
    public func isRaspberryPi5() -> Bool {
        raspberryPiModel()?.contains("Raspberry Pi 5") == true
    }

    /// Whether Raspberry Pi OS's Bluetooth service is installed: there the
    /// onboard radio is attached from user space by hciuart.service
    /// (btuart); elsewhere (Debian's kernel, this project's image) the
    /// kernel binds it itself (serdev hci_uart with btbcm).
    public func hasHciuartService() -> Bool {
        ["/lib/systemd/system/hciuart.service", "/usr/lib/systemd/system/hciuart.service"].contains { exists($0) }
    }

    /// The running kernel's release (`6.12.22+rpt-rpi-v8`, `6.12.38+deb13-arm64`).
    public func kernelRelease() -> String? {
        read("/proc/sys/kernel/osrelease")
    }

    // MARK: The appliance image

    /// The directory only this project's SD-card image has (its first-boot
    /// script lives there).
    public static let imageMarker = "/usr/lib/blecontrol-image"

    /// Whether this machine runs this project's SD-card image.
    public func isBLEControlImage() -> Bool {
        exists(Self.imageMarker)
    }

    // MARK: Watchdog

    /// A hardware watchdog as sysfs describes it (`/sys/class/watchdog/NAME`;
    /// the attributes need CONFIG_WATCHDOG_SYSFS, and every one of them may
    /// be read by any user).
    public struct Watchdog: Sendable, Equatable {
        /// `watchdog0`.
        public var name: String
        /// The driver's name for it: "Broadcom BCM2835 Watchdog timer".
        public var identity: String?
        /// "active" while someone (systemd) has it open and keeps it fed.
        public var state: String?
        /// The timeout now set, in seconds.
        public var timeout: Int?
        /// The longest timeout the device takes, in seconds (15 on bcm2835-wdt).
        public var maxTimeout: Int?
    }

    /// The watchdog `name` (`watchdog0`), nil when there is none.
    public func watchdog(_ name: String) -> Watchdog? {
        let directory = "/sys/class/watchdog/\(name)"
        guard exists(directory) else { return nil }
        return Watchdog(
            name: name,
            identity: read("\(directory)/identity"),
            state: read("\(directory)/state"),
            timeout: read("\(directory)/timeout").flatMap { Int($0) },
            maxTimeout: read("\(directory)/max_timeout").flatMap { Int($0) }
        )
    }

    // MARK: systemd units

    /// Whether a unit starts at boot, from the files `systemctl is-enabled`
    /// reads (no systemd needed, so it works under ``root``).
    public enum UnitState: Sendable, Equatable {
        /// No unit file in any unit directory.
        case notInstalled
        /// Its unit file in /etc or /run is a link to /dev/null.
        case masked(String)
        /// Installed, with no link in the `.wants` directory of a target
        /// its `[Install]` section names.
        case disabled
        /// A link at this path pulls it in.
        case enabled(link: String)
    }

    /// The unit directories, most important first (systemd.unit(5)).
    static let unitDirectories = ["/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"]

    /// The state of `unit` (`blecontrol-safe-outputs.service`); a unit
    /// without `WantedBy=` is looked for under `defaultTarget`.
    public func unitState(_ unit: String, defaultTarget: String) -> UnitState {
        guard let file = Self.unitDirectories.map({ "\($0)/\(unit)" }).first(where: exists) else { return .notInstalled }
        if file.hasPrefix("/etc/") || file.hasPrefix("/run/"), Doctor.linkTarget(path(file)) == "/dev/null" {
            return .masked(file)
        }
        let install = Self.iniSettings(read(file) ?? "")
        let targets = (install["Install.WantedBy"] ?? install["Install.RequiredBy"])?.split(separator: " ").map(String.init) ?? [defaultTarget]
        for target in targets {
            for directory in Self.unitDirectories {
                let link = "\(directory)/\(target).wants/\(unit)"
                if exists(link) { return .enabled(link: link) }
            }
        }
        return .disabled
    }

    // MARK: File systems

    /// One line of /proc/self/mountinfo (proc(5)).
    public struct Mount: Sendable, Equatable {
        /// The device's `major:minor`.
        public var device: String
        /// Where it is mounted (`/`, `/boot/firmware`).
        public var mountPoint: String
        /// The file system type (`ext4`, `vfat`).
        public var type: String
        /// `/dev/mmcblk0p2` (or `/dev/root` for a root the kernel mounted).
        public var source: String
        /// The mount's own options (`rw,relatime`).
        public var options: [String]
        /// The file system's (`ro,errors=remount-ro`): where the kernel
        /// records a read-only remount after errors, while the mount's own
        /// options still say `rw`.
        public var superOptions: [String]

        /// Read-only, by the mount or by the file system under it.
        public var isReadOnly: Bool { options.contains("ro") || superOptions.contains("ro") }
    }

    /// The mounts this process sees, in mount order.
    public func mounts() -> [Mount] {
        (read("/proc/self/mountinfo") ?? "").split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ").map { Self.unescapeMountField(String($0)) }
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - TYPE SOURCE SUPEROPTIONS
            guard fields.count >= 10, let dash = fields.firstIndex(of: "-"), dash >= 6, dash + 3 < fields.count else { return nil }
            return Mount(
                device: fields[2], mountPoint: fields[4], type: fields[dash + 1], source: fields[dash + 2],
                options: fields[5].split(separator: ",").map(String.init),
                superOptions: fields[dash + 3].split(separator: ",").map(String.init)
            )
        }
    }

    /// One line of /etc/fstab (fstab(5)).
    public struct FstabEntry: Sendable, Equatable {
        /// What is mounted: `LABEL=RASPIROOT`, `PARTUUID=…`, `/dev/…`.
        public var source: String
        /// Where it goes (`/`, `/boot/firmware`).
        public var mountPoint: String
        /// The file system type (`ext4`, `vfat`).
        public var type: String
        /// The mount options (`rw`, `errors=remount-ro`, `noauto`).
        public var options: [String]
        /// fsck's pass: 0 is never checked at boot.
        public var pass: Int
    }

    /// The entries of /etc/fstab, comments left out.
    public func fstab() -> [FstabEntry] {
        (read("/etc/fstab") ?? "").split(separator: "\n").compactMap { line in
            let text = String(line).trimmed
            guard !text.isEmpty, !text.hasPrefix("#") else { return nil }
            let fields = text.split(whereSeparator: { $0 == " " || $0 == "\t" }).map { Self.unescapeMountField(String($0)) }
            guard fields.count >= 4 else { return nil }
            return FstabEntry(
                source: fields[0], mountPoint: fields[1], type: fields[2],
                options: fields[3].split(separator: ",").map(String.init),
                pass: fields.count >= 6 ? Int(fields[5]) ?? 0 : 0
            )
        }
    }

    /// `\040` and the other octal escapes mountinfo and fstab use for
    /// spaces, tabs and backslashes.
    static func unescapeMountField(_ field: String) -> String {
        guard field.contains("\\") else { return field }
        var bytes: [UInt8] = []
        let utf8 = Array(field.utf8)
        var index = 0
        while index < utf8.count {
            if utf8[index] == UInt8(ascii: "\\"), index + 3 < utf8.count,
               let value = UInt8(String(decoding: utf8[(index + 1)...(index + 3)], as: UTF8.self), radix: 8) {
                bytes.append(value)
                index += 4
            } else {
                bytes.append(utf8[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A mounted ext4 file system and the errors it has recorded.
    public struct Ext4Errors: Sendable, Equatable {
        /// The block device's name (`mmcblk0p2`).
        public var device: String
        /// Errors since the file system was last checked (the superblock's
        /// s_error_count, which e2fsck clears).
        public var count: Int
        /// Where it is mounted, if found.
        public var mountPoint: String?
    }

    /// Every mounted ext4 file system (`/sys/fs/ext4/DEVICE`) with its error count.
    public func ext4Errors() -> [Ext4Errors] {
        let mounts = mounts()
        return list("/sys/fs/ext4").compactMap { device in
            guard let count = read("/sys/fs/ext4/\(device)/errors_count").flatMap({ Int($0) }) else { return nil }
            // By device number: a root the kernel mounted is "/dev/root" in mountinfo.
            let number = read("/sys/class/block/\(device)/dev")
            let mount = mounts.last { $0.device == number || $0.source == "/dev/\(device)" }
            return Ext4Errors(device: device, count: count, mountPoint: mount?.mountPoint)
        }
    }

    /// Bytes the files under `directory` occupy on disk (what `du` and
    /// `journalctl --disk-usage` count); 0 when it is missing.
    public func diskUsage(_ directory: String) -> UInt64 {
        var total: UInt64 = 0
        var pending = [path(directory)]
        while let current = pending.popLast() {
            for entry in Files.list(current) {
                let child = current + "/" + entry
                var info = stat()
                guard lstat(child, &info) == 0 else { continue }
                total += UInt64(max(info.st_blocks, 0)) * 512
                if info.st_mode & S_IFMT == S_IFDIR { pending.append(child) }
            }
        }
        return total
    }

    /// The size in bytes of the file system holding `path`, nil if unknown.
    public func fileSystemSize(_ absolutePath: String) -> UInt64? {
        var info = statvfs()
        guard statvfs(path(absolutePath), &info) == 0 else { return nil }
        return UInt64(info.f_blocks) * UInt64(info.f_frsize)
    }

    // MARK: Users and device nodes

    /// A user and every group it is a member of.
    public struct Account: Sendable, Equatable {
        public var name: String
        public var uid: UInt32
        public var gid: UInt32
        /// Group ids: the primary group and the supplementary ones.
        public var groups: [UInt32]
    }

    /// The account `name` from the name service, nil if there is none.
    public static func account(named name: String) -> Account? {
        guard let entry = getpwnam(name) else { return nil }
        let uid = entry.pointee.pw_uid, gid = entry.pointee.pw_gid
        var count: Int32 = 64
        var groups = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, gid, &groups, &count) < 0 {
            groups = [gid_t](repeating: 0, count: Int(count))
            _ = getgrouplist(name, gid, &groups, &count)
        }
        return Account(name: name, uid: uid, gid: gid, groups: Array(groups.prefix(Int(max(count, 0)))))
    }

    /// The id of group `name`, nil if there is no such group.
    public static func groupID(named name: String) -> UInt32? {
        getgrnam(name).map { $0.pointee.gr_gid }
    }

    /// The name of group `gid`, or the number.
    public static func groupName(_ gid: UInt32) -> String {
        getgrgid(gid).map { String(cString: $0.pointee.gr_name) } ?? String(gid)
    }

    /// The name of user `uid`, or the number.
    public static func userName(_ uid: UInt32) -> String {
        getpwuid(uid).map { String(cString: $0.pointee.pw_name) } ?? String(uid)
    }

    /// A device node's type, owner and mode.
    public struct Node: Sendable, Equatable {
        public var isCharacterDevice: Bool
        public var uid: UInt32
        public var gid: UInt32
        public var mode: UInt32

        /// "crw-rw---- root:i2c".
        public var description: String {
            let bits = (0..<9).map { index -> Character in
                let bit = UInt32(1) << UInt32(8 - index)
                return mode & bit == 0 ? "-" : Array("rwx")[index % 3]
            }
            return (isCharacterDevice ? "c" : "-") + String(bits) + " \(SystemInspector.userName(uid)):\(SystemInspector.groupName(gid))"
        }

        /// Whether a process with these ids may open the node read-write by
        /// its mode bits (root may always; ACLs are not consulted).
        /// Whether a process of `uid` in `groups` may read it (root may).
        public func readable(uid: UInt32, groups: [UInt32]) -> Bool {
            if uid == 0 { return true }
            if uid == self.uid { return mode & 0o400 != 0 }
            if groups.contains(gid) { return mode & 0o040 != 0 }
            return mode & 0o004 != 0
        }

        public func readWritable(uid: UInt32, groups: [UInt32]) -> Bool {
            if uid == 0 { return true }
            if uid == self.uid { return mode & 0o600 == 0o600 }
            if groups.contains(gid) { return mode & 0o060 == 0o060 }
            return mode & 0o006 == 0o006
        }
    }

    /// The node at `path` (a real path, not under ``root``), nil if missing.
    public static func node(at path: String) -> Node? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Node(
            isCharacterDevice: info.st_mode & S_IFMT == S_IFCHR,
            uid: info.st_uid, gid: info.st_gid, mode: UInt32(info.st_mode & 0o7777)
        )
    }

    // MARK: Packages

    /// The version of Debian package `name` as dpkg has it installed
    /// (`5.66-1+rpt1+deb12u2`), nil when it is not installed. Asked of
    /// dpkg-query, dpkg's interface for it (its database's format is dpkg's
    /// own business: Debian policy, and lintian's uses-dpkg-database-directly);
    /// under a ``root`` other than /, of that root's database (--root).
    public func installedPackageVersion(_ name: String) -> String? {
        var arguments = ["--show", "--showformat=${db:Status-Abbrev}${Version}\\n", "--", name]
        if root != "/" && !root.isEmpty { arguments.insert("--root=\(root)", at: 0) }
        // "ii 5.66-1": wanted install, installed; then the version. (The
        // runner may mix in dpkg-query's warnings, on lines of their own.)
        guard let answer = run("/usr/bin/dpkg-query", arguments),
              let line = answer.split(separator: "\n").first(where: { $0.hasPrefix("ii ") }) else { return nil }
        let version = String(line.dropFirst(3)).trimmed
        return version.isEmpty ? nil : version
    }
}
