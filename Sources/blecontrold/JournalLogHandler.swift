#if canImport(Glibc)
import Glibc
#endif
import Logging
import Reactor

/// Log lines on standard error that journald files at the right priority:
/// under systemd (stderr connected to the journal, per `$JOURNAL_STREAM`)
/// each line starts with `<N>`, its syslog priority (sd-daemon(3)), so
/// `journalctl -u blecontrold -p err` shows the daemon's errors; on a
/// terminal, a timestamp and the level instead.
///
/// A message may carry what a sender chose (a topic, a payload, a device's
/// name), so every line is one line whatever it holds: control characters
/// and invalid UTF-8 are escaped (a newline in a payload cannot start a
/// journal entry of its own, with a `<N>` priority of its own) and a line
/// is cut at ``maximumMessageLength``. Each place in the code logs at most
/// ``limiter``'s burst a minute; the next line from it says how many it
/// held back.
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

    /// Scalars of a message kept in its line.
    static let maximumMessageLength = 1024
    /// One for the process: lines per place in the code, per minute.
    static let limiter = LogLimiter(burst: 20, window: .seconds(60))

    // swift-log 1.12 made log(event:) the requirement (the older method is
    // deprecated); Swift 6.0.3 resolves releases before it (Package.swift).
    #if compiler(>=6.1)
    func log(event: LogEvent) {
        emit(level: event.level, message: event.message, metadata: event.metadata, file: event.file, line: event.line)
    }
    #else
    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        emit(level: level, message: message, metadata: metadata, file: file, line: line)
    }
    #endif

    private func emit(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, file: String, line: UInt) {
        guard case .log(let heldBack) = Self.limiter.admit("\(file):\(line)") else { return }
        let prefix = toJournal ? "<\(Self.priority(level))>" : "\(Self.timestamp()) \(level) "
        var body = "\(message)"
        let merged = self.metadata.merging(metadata ?? [:]) { $1 }
        if !merged.isEmpty {
            body += " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        var text = ""
        if heldBack > 0 { text += "\(prefix)\(label): (\(heldBack) more like the next line were not logged this last minute)\n" }
        text += "\(prefix)\(label): \(body.escaped(maximumLength: Self.maximumMessageLength))\n"
        // One write per line, so lines from several threads never interleave.
        let bytes = Array(text.utf8)
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
