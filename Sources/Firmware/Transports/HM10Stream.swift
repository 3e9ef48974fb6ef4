/// What arrives from an HM-10 in transparent mode, sorted into the central's
/// data and the module's own connection notices (`OK+CONN`, `OK+LOST`,
/// sent with AT+NOTI1 on).
///
/// The module writes a notice into the same byte stream as the central's
/// data, and a central may write anything, so where a notice is taken as
/// one follows from what the two can look like:
/// - Where a frame may start (the session holds no partial frame), a
///   complete notice is one at once: `O` (0x4F) is no command, so a
///   central's frame never starts there.
/// - Inside a frame, the same letters are usually the central's (an LCD
///   text saying "OK+LOST"), but they are also what follows when a central
///   leaves in the middle of a frame. There a complete notice counts once
///   the line has been quiet for ``hold`` after it (the module sends nothing
///   once its central is gone, while a central's frame goes on), or when
///   another notice follows it at once (a central that left, then the next
///   one connecting).
/// - Bytes that may still become a notice are held back, at most ``hold``
///   after the last byte arrived; a byte that breaks the match releases the
///   first held byte as data and the rest is matched again (a central's
///   last write ending in `O`, `OK` or `OK+` does not hide the `OK+LOST`
///   right after it).
///
/// At most ``maximumHeld`` bytes are held. Pure:
/// time is the instants it is given; the owner arms a timer at ``deadline``
/// and calls ``expire(at:emit:)``.
public struct HM10Stream: Sendable {
    /// A stretch of the stream, in order.
    public enum Event: Equatable, Sendable {
        /// The central's bytes.
        case data([UInt8])
        /// `OK+CONN`: a central connected.
        case connected
        /// `OK+LOST`: the central left.
        case lost
    }

    /// The module's notices, as it writes them (HM-10 data sheet, AT+NOTI).
    public static let connectedNotice = Array("OK+CONN".utf8)
    public static let lostNotice = Array("OK+LOST".utf8)
    /// The byte every notice starts with.
    private static let noticeStart = connectedNotice[0]
    private static let noticeLength = connectedNotice.count

    /// How long a possible notice is held after the last byte: the module
    /// sends a notice in one burst (7 bytes: 58 ms at 1200 baud, the slowest
    /// HM-10 rate, a few ms at 9600), and a central's frame continues within
    /// a connection interval or two.
    public static let defaultHold: Duration = .milliseconds(100)

    /// The most bytes ever held: a whole notice inside a frame, and all but
    /// the last byte of the one that may follow it.
    public static let maximumHeld = 2 * noticeLength - 1

    /// How long possible notice bytes are held after the last byte.
    public let hold: Duration
    /// Bytes that may be (or start) a notice, not yet handed on.
    public private(set) var pending: [UInt8] = []
    private var lastByteAt: ContinuousClock.Instant?

    /// - Parameter hold: how long possible notice bytes are held after the
    ///   last byte (tests shorten or lengthen it).
    public init(hold: Duration = defaultHold) {
        self.hold = hold
        pending.reserveCapacity(Self.maximumHeld)
    }

    /// When the held bytes are released (as data, or as a notice inside a
    /// frame), if nothing arrives before; nil when nothing is held.
    public var deadline: ContinuousClock.Instant? {
        guard !pending.isEmpty, let lastByteAt else { return nil }
        return lastByteAt + hold
    }

    /// Sorts `bytes`, received at `now`, calling `emit` in stream order.
    /// `atFrameBoundary` is asked, once every data event before it has been
    /// handled, whether a frame may start here.
    ///
    /// Held bytes are never released here for being old: a loop that woke
    /// late may read a notice's rest together with this, and ``expire(at:emit:)``
    /// is where silence is judged.
    public mutating func feed<C: Collection>(_ bytes: C, at now: ContinuousClock.Instant, atFrameBoundary: () -> Bool, emit: (Event) -> Void) where C.Element == UInt8 {
        guard !bytes.isEmpty else { return }
        lastByteAt = now
        var run: [UInt8] = []
        for byte in bytes {
            if pending.isEmpty && byte != Self.noticeStart {
                run.append(byte)
            } else {
                pending.append(byte)
                resolve(into: &run, atFrameBoundary: atFrameBoundary, emit: emit)
            }
        }
        if !run.isEmpty { emit(.data(run)) }
    }

    /// Releases what is held if the line has been quiet for longer than
    /// ``hold``: a whole notice inside a frame that nothing followed as the
    /// notice, anything else as data (a notice followed by the start of
    /// another that never came was followed by the central's bytes).
    public mutating func expire(at now: ContinuousClock.Instant, emit: (Event) -> Void) {
        guard let deadline, now > deadline else { return }
        if pending.count == Self.noticeLength, let notice = Self.notice(at: pending[...]) {
            emit(notice)
        } else {
            emit(.data(pending))
        }
        pending.removeAll()
    }

    /// Decides what it can about the held bytes: data goes to `run` (handed
    /// on in one piece, not a byte at a time), notices out, and what may
    /// still become a notice stays.
    private mutating func resolve(into run: inout [UInt8], atFrameBoundary: () -> Bool, emit: (Event) -> Void) {
        while let first = pending.first {
            if first != Self.noticeStart {
                // Not the start of a notice: data, up to the next O.
                let end = pending.firstIndex(of: Self.noticeStart) ?? pending.endIndex
                run += pending[..<end]
                pending.removeFirst(end)
                continue
            }
            if let notice = Self.notice(at: pending[...]) {
                let rest = pending[Self.noticeLength...]
                // The session must have seen every byte before the notice to
                // say whether a frame may start there.
                if !run.isEmpty {
                    emit(.data(run))
                    run.removeAll(keepingCapacity: true)
                }
                // Inside a frame: a notice only once the line is quiet after
                // it, or when another notice follows at once.
                if atFrameBoundary() || Self.notice(at: rest) != nil {
                    pending.removeFirst(Self.noticeLength)
                    emit(notice)
                    continue
                }
                if rest.isEmpty || Self.isNoticePrefix(rest) { return }
            } else if Self.isNoticePrefix(pending[...]) {
                return
            }
            // The match broke: its first byte is data, the rest is matched again.
            run.append(first)
            pending.removeFirst()
        }
    }

    /// The notice `bytes` start with, if they start with a whole one.
    private static func notice(at bytes: ArraySlice<UInt8>) -> Event? {
        if bytes.starts(with: connectedNotice) { return .connected }
        if bytes.starts(with: lostNotice) { return .lost }
        return nil
    }

    /// Whether `bytes` (non-empty) are the beginning of a notice, short of a whole one.
    private static func isNoticePrefix(_ bytes: ArraySlice<UInt8>) -> Bool {
        bytes.count < noticeLength && (connectedNotice.starts(with: bytes) || lostNotice.starts(with: bytes))
    }
}
