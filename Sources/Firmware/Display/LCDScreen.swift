import Devices

/// What the LCD should show: the centrals' framebuffer (LCD_TEXT and
/// LCD_CLEAR write only this) and, over it, the messages the board itself
/// shows (the failsafe and its reason, a pairing passkey). A message covers
/// some rows while it is up; when it goes, the framebuffer shows again,
/// exactly as the centrals left it: nothing they wrote is lost.
///
/// Pure: the LCD service keeps one under its lock and hands its rows to
/// the driver.
struct LCDScreen: Equatable {
    typealias Message = SystemMessage

    let rows: Int
    /// The centrals' text per row, as character codes.
    private(set) var framebuffer: [[UInt8]]
    /// Active messages: per row, text or nil (that row shows through).
    private(set) var messages: [Message: [String?]] = [:]

    init(rows: Int) {
        self.rows = rows
        framebuffer = Array(repeating: [], count: rows)
    }

    mutating func setLine(_ row: Int, codes: [UInt8]) {
        guard (0..<rows).contains(row) else { return }
        framebuffer[row] = codes
    }

    mutating func clear() {
        framebuffer = Array(repeating: [], count: rows)
    }

    /// Puts up (or, with nil, takes down) one of the board's messages.
    mutating func show(_ message: Message, _ lines: [String?]?) {
        messages[message] = lines
    }

    /// The message covering the screen now, if any (the highest priority).
    var topMessage: Message? { messages.keys.min() }

    /// The codes each row shows: the framebuffer, with every active message's
    /// rows over it (higher priorities win a row).
    var shown: [[UInt8]] {
        var rowsShown = framebuffer
        for message in messages.keys.sorted(by: >) {
            for (row, line) in (messages[message] ?? []).enumerated() where row < rows {
                if let line { rowsShown[row] = CharacterROM.encode(line) }
            }
        }
        return rowsShown
    }
}

/// The board's own messages on the LCD, highest priority first: a passkey
/// must be readable even during a failsafe.
public enum SystemMessage: Int, Sendable, CaseIterable, Comparable {
    case passkey
    case failsafe

    public static func < (lhs: SystemMessage, rhs: SystemMessage) -> Bool { lhs.rawValue < rhs.rawValue }

    public var name: String {
        switch self {
        case .passkey: return "passkey"
        case .failsafe: return "failsafe"
        }
    }
}
