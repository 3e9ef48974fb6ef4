#if canImport(Glibc)
import Glibc
#endif
import Logging

/// Log lines on standard error that journald files at the right priority:
/// under systemd (stderr connected to the journal, per `$JOURNAL_STREAM`)
/// each line starts with `<N>`, its syslog priority (sd-daemon(3)), so
/// `journalctl -u blecontrold -p err` shows the daemon's errors; on a
/// terminal, a timestamp and the level instead.
struct JournalLogHandler: LogHandler {
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]
    let label: String
    private let toJournal: Bool

    init(label: String, level: Logger.Level) {
        self.label = label
        logLevel = level
        toJournal = Self.stderrIsJournal()
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        var text = toJournal ? "<\(Self.priority(level))>" : "\(Self.timestamp()) \(level) "
        text += "\(label): \(message)"
        let merged = self.metadata.merging(metadata ?? [:]) { $1 }
        if !merged.isEmpty {
            text += " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        // One write per line, so lines from several threads never interleave.
        let bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }

    /// syslog priorities (sd-daemon.h SD_ERR…): swift-log's levels mapped
    /// as systemd's own journal client does.
    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    /// `text` as error lines for standard error: each line prefixed `<3>`
    /// under systemd, so a refused board file shows in `journalctl -p err`
    /// (a line without a prefix is filed at info); as it is on a terminal.
    static func errorLines(_ text: String) -> String {
        guard stderrIsJournal() else { return text }
        return text.split(separator: "\n", omittingEmptySubsequences: false).map { "<3>\($0)" }.joined(separator: "\n")
    }

    /// True when stderr is the stream systemd connected to the journal:
    /// `$JOURNAL_STREAM` is "DEVICE:INODE" of that stream (systemd.exec(5)).
    static func stderrIsJournal() -> Bool {
        guard let value = getenv("JOURNAL_STREAM") else { return false }
        let parts = String(cString: value).split(separator: ":")
        var info = stat()
        guard parts.count == 2, fstat(2, &info) == 0 else { return false }
        return UInt64(parts[0]) == UInt64(info.st_dev) && UInt64(parts[1]) == UInt64(info.st_ino)
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S", &parts)
        let millis = now.tv_nsec / 1_000_000
        let fraction = millis < 10 ? "00\(millis)" : millis < 100 ? "0\(millis)" : "\(millis)"
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) + "." + fraction
    }
}
