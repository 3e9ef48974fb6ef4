import Reactor

/// One setting of a systemd configuration file as systemd ends up reading
/// it, and the file that set it.
public struct SystemdSetting: Sendable, Equatable {
    /// The value as written (`15s`, `64M`, `persistent`).
    public var value: String
    /// The file whose assignment won, e.g.
    /// `/etc/systemd/journald.conf.d/blecontrol.conf`.
    public var file: String

    public init(value: String, file: String) {
        self.value = value
        self.file = file
    }
}

extension SystemInspector {
    /// Where systemd looks for its own configuration, most important first
    /// (systemd.syntax(7), "Configuration Directories and Precedence").
    static let systemdConfigurationDirectories = ["/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd"]

    /// The effective `Section.Key` settings of a systemd daemon's
    /// configuration (`journald.conf`, `system.conf`), read the way systemd
    /// reads them: the first main file of the configuration directories,
    /// then every `*.conf` of the `NAME.d` drop-in directories in file-name
    /// order, whatever directory each is in, a file hiding one of the same
    /// name in a less important directory (a link to /dev/null then hides it
    /// with nothing). A later assignment wins; an empty one puts the default
    /// back, so the key is left out.
    public func systemdSettings(_ name: String) -> [String: SystemdSetting] {
        var files: [String] = []
        if let main = Self.systemdConfigurationDirectories.map({ "\($0)/\(name)" }).first(where: exists) {
            files.append(main)
        }
        files += dropIns(["\(name).d"], in: Self.systemdConfigurationDirectories)

        var settings: [String: SystemdSetting] = [:]
        for file in files {
            for (key, value) in Self.iniAssignments(read(file) ?? "") {
                settings[key] = value.isEmpty ? nil : SystemdSetting(value: value, file: file)
            }
        }
        return settings
    }

    /// The `*.conf` files of the drop-in directories `names` (least specific
    /// first) under `directories` (most important first), in the order
    /// systemd reads them: by file name, whatever directory each is in, a
    /// file hiding one of the same name in a less important or less
    /// specific directory.
    func dropIns(_ names: [String], in directories: [String]) -> [String] {
        var byName: [String: String] = [:]
        for name in names {
            for directory in directories.reversed() {
                for entry in list("\(directory)/\(name)") where entry.hasSuffix(".conf") {
                    byName[entry] = "\(directory)/\(name)/\(entry)"
                }
            }
        }
        return byName.keys.sorted().compactMap { byName[$0] }
    }

    /// Where `systemctl set-property` puts its drop-ins (in /run with
    /// --runtime), and systemd those of transient units: before the unit
    /// directories (systemd.unit(5), "Unit File Load Path").
    static let unitControlDirectories = ["/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient"]

    /// Every assignment of a service's unit file and its drop-ins
    /// (`NAME.service.d/`, and `service.d/` for every service), as
    /// `Section.Key`, in the order systemd applies them; nil when the unit
    /// is not installed or is masked. What an assignment means (a list that
    /// grows, an empty one that resets it, a value the last one sets) is
    /// the caller's to say.
    func unitAssignments(_ unit: String) -> [(key: String, setting: SystemdSetting)]? {
        guard let file = Self.unitDirectories.map({ "\($0)/\(unit)" }).first(where: exists),
              Doctor.linkTarget(path(file)) != "/dev/null" else { return nil }
        let type = unit.split(separator: ".").last.map(String.init) ?? "service"
        let files = [file] + dropIns(["\(type).d", "\(unit).d"], in: Self.unitControlDirectories + Self.unitDirectories)
        return files.flatMap { file in
            Self.iniAssignments(read(file) ?? "").map { (key: $0.0, setting: SystemdSetting(value: $0.1, file: file)) }
        }
    }

    /// `Section.Key` → value of an INI file such as bluetoothd's main.conf
    /// (comments and blank lines skipped; a later assignment wins).
    public static func iniSettings(_ text: String) -> [String: String] {
        var settings: [String: String] = [:]
        for (key, value) in iniAssignments(text) { settings[key] = value }
        return settings
    }

    /// The assignments of an INI file in order, each as `Section.Key`.
    private static func iniAssignments(_ text: String) -> [(String, String)] {
        var section = ""
        var assignments: [(String, String)] = []
        for raw in text.split(separator: "\n") {
            let line = String(raw).trimmed
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("["), line.hasSuffix("]") {
                section = String(line.dropFirst().dropLast()).trimmed
            } else if let equals = line.firstIndex(of: "=") {
                let key = String(line[..<equals]).trimmed
                assignments.append(("\(section).\(key)", String(line[line.index(after: equals)...]).trimmed))
            }
        }
        return assignments
    }
}

/// The value syntax of systemd's configuration files.
public enum SystemdValue {
    /// Seconds in a time span (systemd.time(7): `15s`, `1min 30s`, `2h`, a
    /// bare number is seconds); 0 for `off`; nil when it is not one.
    public static func seconds(_ text: String) -> Double? {
        let text = text.trimmed
        if text.lowercased() == "off" { return 0 }
        if text.lowercased() == "infinity" { return .infinity }
        let units: [(String, Double)] = [
            ("usec", 1e-6), ("us", 1e-6), ("µs", 1e-6), ("msec", 1e-3), ("ms", 1e-3),
            ("seconds", 1), ("second", 1), ("sec", 1), ("s", 1),
            ("minutes", 60), ("minute", 60), ("min", 60), ("m", 60),
            ("hours", 3600), ("hour", 3600), ("hr", 3600), ("h", 3600),
            ("days", 86_400), ("day", 86_400), ("d", 86_400),
            ("weeks", 604_800), ("week", 604_800), ("w", 604_800),
            // "M" is a month, "m" a minute.
            ("months", 2_629_800), ("month", 2_629_800), ("M", 2_629_800), ("years", 31_557_600), ("year", 31_557_600), ("y", 31_557_600),
        ]
        return sum(of: text, units: units, bareUnit: 1)
    }

    /// Bytes in a size (journald.conf(5): a number with K, M, G, T, P or E,
    /// each 1024 times the one before; a bare number is bytes); nil when it
    /// is not one.
    public static func bytes(_ text: String) -> Double? {
        let units: [(String, Double)] = [("B", 1)] + ["K", "M", "G", "T", "P", "E"].enumerated().map { index, unit in
            var factor = 1024.0
            for _ in 0..<index { factor *= 1024 }
            return (unit, factor)
        }
        return sum(of: text.trimmed, units: units, bareUnit: 1)
    }

    /// "64.0M" for a number of bytes, the way journalctl prints sizes.
    public static func size(_ bytes: Double) -> String {
        var value = bytes
        for unit in ["B", "K", "M", "G", "T", "P"] {
            if value < 1024 || unit == "P" {
                return unit == "B" ? "\(Int(value))B" : "\(value.fixed(1))\(unit)"
            }
            value /= 1024
        }
        return "\(bytes)B"
    }

    /// "15 s", "1 min 30 s" for a time span, whole seconds.
    public static func span(_ seconds: Double) -> String {
        guard seconds.isFinite else { return "infinity" }
        let whole = Int(seconds.rounded())
        if whole >= 60, whole % 60 == 0 { return "\(whole / 60) min" }
        if whole >= 60 { return "\(whole / 60) min \(whole % 60) s" }
        return "\(whole) s"
    }

    /// The sum of `NUMBER[UNIT]` terms, spaces between them optional.
    private static func sum(of text: String, units: [(String, Double)], bareUnit: Double) -> Double? {
        var rest = Substring(text)
        var total = 0.0
        var terms = 0
        while let first = rest.first {
            if first == " " { rest = rest.dropFirst(); continue }
            let digits = rest.prefix { $0.isNumber || $0 == "." }
            guard !digits.isEmpty, let number = Double(digits) else { return nil }
            rest = rest.dropFirst(digits.count)
            let letters = rest.prefix { !$0.isNumber && $0 != " " && $0 != "." }
            rest = rest.dropFirst(letters.count)
            if letters.isEmpty {
                total += number * bareUnit
            } else if let unit = units.first(where: { $0.0 == letters }) {
                total += number * unit.1
            } else {
                return nil
            }
            terms += 1
        }
        return terms > 0 ? total : nil
    }
}
