#if canImport(Glibc)
import Glibc
#endif
import Control
import Reactor

/// The board file's names for the outputs (`name:` of a channel or switch,
/// `lcd.line_names`), as the control page reads them from `/board.json`:
///
///     {"board":"rc-car","channels":[{"channel":0,"name":"steering"}],
///      "switches":[{"switch":0,"name":"lights"}],"lcd_lines":[{"line":0,"name":"Speed"}]}
///
/// `board` is the board's name (null, and every list empty, when no daemon
/// could be asked): the page shows the names only once the board it
/// connected to says that name in its Device Information (model), so a
/// page served here never labels another board's outputs with this one's.
///
/// The daemon is trusted as far as its socket is (ControlClient checks who
/// owns it); its names are still checked again here, because the page shows
/// them by the rule the board file applies (``OutputName``): an unfit one is
/// left out and that output keeps its number. Only the numbers the protocol
/// can address are kept (channels and switches 0–255, an HD44780's 4
/// lines), one name each, so the document is at most ``maximumBytes`` whatever the daemon sends.
struct WebBoardNames {
    /// Where the page asks for it.
    static let path = "/board.json"
    /// An HD44780 drives at most 4 lines (the board file's lcd.rows: 1, 2 or 4).
    static let maximumLines = 4
    /// 512 entries of at most 160 bytes each, a quote or backslash among
    /// them escaped: about 116 KiB at worst (a real board's is tens of bytes).
    static let maximumBytes = 128 * 1024

    var board: String?
    var channels: [(number: Int, name: String)] = []
    var switches: [(number: Int, name: String)] = []
    var lines: [(number: Int, name: String)] = []

    /// No board: what the page gets when no daemon answered.
    init() {}

    /// The names in a daemon's status, checked.
    init(_ report: StatusReport) {
        guard let board = Self.label(report.board) else { return }
        self.board = board
        channels = Self.named(report.channels.map { ($0.channel, $0.name) }, in: 0...255)
        switches = Self.named(report.switches.map { ($0.switch, $0.name) }, in: 0...255)
        lines = Self.named((report.lcd?.lineNames ?? []).enumerated().map { ($0.offset, $0.element) }, in: 0...(Self.maximumLines - 1))
    }

    /// The document the page reads.
    var json: [UInt8] {
        func list(_ key: String, _ entries: [(number: Int, name: String)]) -> JSONValue {
            .array(entries.map { .object([(key, .number(String($0.number))), ("name", .string($0.name))]) })
        }
        return JSONValue.object([
            ("board", board.map { .string($0) } ?? .null),
            ("channels", list("channel", channels)),
            ("switches", list("switch", switches)),
            ("lcd_lines", list("line", lines)),
        ]).serialized()
    }

    /// What `blecontrol web` says about them.
    var summary: String {
        func count(_ entries: [(number: Int, name: String)], _ one: String, _ many: String) -> String { "\(entries.count) \(entries.count == 1 ? one : many)" }
        return "board \(board ?? "unnamed"), \(count(channels, "channel", "channels")), \(count(switches, "switch", "switches")) and \(count(lines, "LCD line", "LCD lines")) named"
    }

    /// One name per number in `range`, in number order; the first good
    /// name for a number wins.
    private static func named(_ items: [(Int, String?)], in range: ClosedRange<Int>) -> [(number: Int, name: String)] {
        var found: [Int: String] = [:]
        for (number, name) in items where range.contains(number) && found[number] == nil {
            if let text = label(name) { found[number] = text }
        }
        return found.sorted { $0.key < $1.key }.map { (number: $0.key, name: $0.value) }
    }

    /// `name` if it is fit to show as a label (``OutputName``), else nil.
    static func label(_ name: String?) -> String? {
        guard let name, OutputName.fault(name) == nil else { return nil }
        return name
    }
}

/// Where `blecontrol web` gets the names: the daemon's control socket, asked
/// for its status each time (a blocking call: never on the event loop).
final class WebNameSource: @unchecked Sendable {
    // `said` is read and written only with `lock` held.
    let socketPath: String
    /// How long the daemon gets to answer; the page waits this long at
    /// most (after it, the numbers alone).
    static let timeout: Duration = .seconds(3)
    private let lock = Lock()
    private var said: String?

    init(socketPath: String) {
        self.socketPath = socketPath
    }

    /// The names the daemon has now, or none; says on standard output
    /// whenever that changes (the first time included), so the terminal or
    /// journal tells why the page shows only numbers.
    func read() -> WebBoardNames {
        let names: WebBoardNames
        let note: String
        do {
            names = WebBoardNames(try ControlClient(path: socketPath, timeout: Self.timeout).status())
            note = names.board == nil
                ? "board names: none (the daemon at \(socketPath) gave a board name that is not plain text)"
                : "board names from the daemon at \(socketPath): \(names.summary)"
        } catch {
            names = WebBoardNames()
            note = "board names: none, the page labels outputs by number (\(error))"
        }
        lock.withLock {
            guard note != said else { return }
            said = note
            print(note.printable)
            fflush(nil)
        }
        return names
    }
}
