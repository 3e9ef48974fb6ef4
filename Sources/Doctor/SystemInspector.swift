#if canImport(Glibc)
import Glibc
#endif
import Reactor

/// Read-only facts about the machine for `blecontrol doctor`: processes,
/// sysfs, users and device nodes. Kernel trees (`/proc`, `/sys`, `/boot`) are
/// looked up under ``root``, so tests can hand it a made-up machine; users
/// and groups come from the name service, device nodes from their real paths.
public struct SystemInspector: Sendable {
    /// Where `/proc`, `/sys` and `/boot` are looked up ("/" normally).
    public var root: String

    public init(root: String = "/") {
        self.root = root
    }

    /// `path` (absolute) under ``root``.
    public func path(_ path: String) -> String {
        if root == "/" || root.isEmpty { return path }
        return (root.hasSuffix("/") ? String(root.dropLast()) : root) + path
    }

    /// The file's text without surrounding white space, nil if unreadable.
    public func read(_ absolutePath: String) -> String? {
        Files.text(path(absolutePath))?.trimmed
    }

    public func exists(_ absolutePath: String) -> Bool {
        Files.exists(path(absolutePath))
    }

    /// Directory entries, sorted; empty when the directory is missing.
    public func list(_ absolutePath: String) -> [String] {
        Files.list(path(absolutePath))
    }

    // MARK: Processes

    /// Process ids whose `/proc/PID/comm` is `name` (the kernel truncates
    /// comm to 15 bytes, which "bluetoothd" fits).
    public func processes(named name: String) -> [Int32] {
        list("/proc").compactMap { entry -> Int32? in
            guard let pid = Int32(entry), read("/proc/\(entry)/comm") == name else { return nil }
            return pid
        }.sorted()
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

    // MARK: Programs

    /// Runs a program and returns its standard output (and error), or nil
    /// when it cannot be run or does not finish within `timeout`.
    public static func output(of executable: String, _ arguments: [String], timeout: Duration = .seconds(3)) -> String? {
        Subprocess.output(of: executable, arguments, timeout: timeout)
    }
}
