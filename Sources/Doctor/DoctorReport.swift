import Reactor

/// How bad one finding of `blecontrol doctor` is.
public enum DoctorLevel: String, Sendable, Comparable, CaseIterable {
    /// Works as needed.
    case ok = "OK"
    /// Works, or does not matter on this board, but deserves a look.
    case warn = "WARN"
    /// The board will not work until this is fixed.
    case fail = "FAIL"

    public static func < (lhs: DoctorLevel, rhs: DoctorLevel) -> Bool {
        lhs.rank < rhs.rank
    }

    private var rank: Int {
        switch self {
        case .ok: return 0
        case .warn: return 1
        case .fail: return 2
        }
    }
}

/// One check's outcome: what was looked at, what was found, and for a
/// warning or failure the one thing to do about it.
public struct DoctorFinding: Sendable, Equatable {
    public var level: DoctorLevel
    /// What was checked, e.g. "bus i2c1" or "bluetoothd".
    public var subject: String
    /// What was found, one line.
    public var detail: String
    /// One line: the command or edit that fixes it (nil when nothing to do).
    public var fix: String?

    public init(_ level: DoctorLevel, _ subject: String, _ detail: String, fix: String? = nil) {
        self.level = level
        self.subject = subject
        self.detail = detail
        self.fix = fix
    }
}

/// Findings under a heading ("I2C", "Bluetooth", …).
public struct DoctorSection: Sendable, Equatable {
    public var title: String
    public var findings: [DoctorFinding]

    public init(title: String, findings: [DoctorFinding]) {
        self.title = title
        self.findings = findings
    }
}

/// Everything `blecontrol doctor` found.
public struct DoctorReport: Sendable, Equatable {
    /// The board file the checks were made against (or the embedded simulator's name).
    public var boardSource: String
    public var sections: [DoctorSection]

    public init(boardSource: String, sections: [DoctorSection]) {
        self.boardSource = boardSource
        self.sections = sections
    }

    public var findings: [DoctorFinding] { sections.flatMap(\.findings) }

    /// True when any finding is a failure: the doctor's exit status is 1.
    public var hasFailures: Bool { findings.contains { $0.level == .fail } }

    /// The text the command prints: sections, one finding per line, the fix
    /// indented under it, then the totals.
    public func rendered() -> String {
        var out = "blecontrol doctor: board file \(boardSource)\n"
        for section in sections where !section.findings.isEmpty {
            out += "\n\(section.title)\n"
            for finding in section.findings {
                let tag = finding.level.rawValue.padded(to: 5)
                out += "  \(tag) \(finding.subject): \(finding.detail)\n"
                if let fix = finding.fix, finding.level != .ok {
                    out += "        fix: \(fix)\n"
                }
            }
        }
        let counts = DoctorLevel.allCases.map { level in
            "\(findings.filter { $0.level == level }.count) \(level.rawValue)"
        }
        out += "\n\(counts.joined(separator: ", "))\n"
        return out
    }
}
