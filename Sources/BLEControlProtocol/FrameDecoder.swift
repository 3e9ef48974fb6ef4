/// What the decoder made of a stretch of the byte stream.
public enum DecoderEvent: Equatable, Hashable, Sendable {
    /// A complete, well-formed frame.
    case message(Message)
    /// A frame that could not be decoded, or a partial frame that was dropped.
    case error(ProtocolError)
    /// LCD text shown before its frame is known to be complete: an LCD_TEXT
    /// frame whose declared data lacks the 0x00 was still looking for one
    /// when a write ended. The text is shown at once (a hand-typed frame is
    /// never held back); the frame's final ``message(_:)`` follows once the
    /// stream says how it ends. Not a frame of its own: not counted, never
    /// answered.
    case provisional(Message)
}

/// Reassembles ``Message``s from a BLEControl byte stream (docs/protocol.md,
/// "Frame" and "Resynchronisation").
///
/// The characteristic carries a byte stream, not one frame per write, so the
/// decoder is an incremental state machine: feed it whatever arrived, in any
/// split, and it reports every frame completed, in stream order. One decoder
/// serves one central; two centrals never share one.
///
/// Resynchronisation rules:
/// - An unknown command or a known command with a wrong length is skipped as
///   declared (its data bytes are waited for and dropped), then reported. The
///   decoder never waits for more than the 255 data bytes a length can declare.
/// - LCD_TEXT quirk (docs/protocol.md, "Known quirks"): the original iOS library
///   declares `Character` count + 2, which is too short for "\r\n" and for
///   non-ASCII text from other senders; hand-typed frames forget the 0x00.
///   If the declared data does not end in 0x00, the frame extends to the next
///   0x00 only across text bytes (0x20…0x7E, 0x80…0xFF, CR, LF, TAB), within
///   ``Configuration/textSearchLimit`` further bytes. Any other byte below
///   0x20 ends the search at once: the declared bytes are the text, and that
///   byte starts the next frame (so a correctly declared frame without its
///   0x00 never swallows the frame after it). No terminator within the limit:
///   the declared text stands and decoding resumes right after the declared
///   end. While the search waits for bytes, the text is shown at the end of
///   each write (``DecoderEvent/provisional(_:)``); the frame's message
///   follows when the search ends, however the stream was split.
/// - The text is everything after the line byte up to the frame's first 0x00.
///   The frame ends at the declared end when the declared data ends in 0x00;
///   an earlier 0x00 only ends the text. This cuts at the same place whether or
///   not the quirk extended the frame, and a text holding U+0000 (which the
///   quirk also miscounts) still keeps the stream in sync.
/// - A partial frame idle for longer than ``Configuration/idleTimeout`` is
///   discarded, so one lost write-without-response cannot shift later frames.
///
/// Memory is bounded: the decoder holds one partial frame (at most 257 bytes)
/// plus the quirk lookahead (at most `textSearchLimit` bytes) in a buffer
/// allocated once, and never reads a clock: time is the instants it is given.
public struct FrameDecoder: Sendable {
    /// Tuning of the decoder's resynchronisation.
    public struct Configuration: Sendable {
        /// How long a partial frame may go without a new byte before it is
        /// discarded; `nil` keeps partial frames forever.
        public var idleTimeout: Duration?
        /// The most bytes the LCD_TEXT quirk may extend a frame beyond its
        /// declared end, terminator included. Values below 0 act as 0, which
        /// turns the quirk off.
        public var textSearchLimit: Int

        /// - Parameters:
        ///   - idleTimeout: Idle time after which a partial frame is dropped.
        ///     500 ms is well above the gap between the writes of one frame and
        ///     well below what a user notices.
        ///   - textSearchLimit: 40 covers a 16- or 20-column line of multi-byte
        ///     characters with margin (docs/protocol.md: "display width plus a small margin").
        public init(idleTimeout: Duration? = .milliseconds(500), textSearchLimit: Int = 40) {
            self.idleTimeout = idleTimeout
            self.textSearchLimit = textSearchLimit
        }

        /// The most bytes a decoder with this configuration ever buffers.
        public var maximumBufferedBytes: Int {
            // Saturate: an absurd search limit must not trap here.
            let (sum, overflow) = FrameDecoder.maximumFrameLength.addingReportingOverflow(max(0, textSearchLimit))
            return overflow ? Int.max : sum
        }
    }

    /// Command, length and 255 data bytes.
    static let maximumFrameLength = 2 + Int(UInt8.max)

    /// Where the state machine is within the pending frame.
    private enum Phase: Sendable {
        /// Waiting for the command or the length byte.
        case header
        /// Waiting for declared data; the frame ends at buffer index `end`.
        case data(end: Int)
        /// An LCD_TEXT frame whose declared data (ending at `declaredEnd`) lacks
        /// the terminator: looking for the next 0x00.
        case terminatorSearch(declaredEnd: Int)
    }

    /// The configuration the decoder was created with.
    public let configuration: Configuration
    /// `configuration.textSearchLimit`, never negative.
    private let searchLimit: Int
    /// The pending frame from its command byte on, then the quirk lookahead.
    /// After a failed terminator search it also holds lookahead bytes waiting to
    /// be parsed again, which is why parsing tracks `examined` separately.
    private var buffer: [UInt8]
    /// How many bytes of `buffer` the state machine has examined; between calls
    /// it equals `buffer.count`.
    private var examined = 0
    private var phase = Phase.header
    /// When the last byte arrived, for the idle timeout.
    private var lastByteAt: ContinuousClock.Instant?
    /// During a terminator search: how many buffered bytes the last
    /// provisional text covered (0: none shown yet).
    private var provisionalEnd = 0

    /// Creates a decoder with an empty buffer.
    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        searchLimit = max(0, configuration.textSearchLimit)
        buffer = []
        // Allocate once, here; only an unusually large search limit can make
        // the buffer grow later.
        buffer.reserveCapacity(Self.maximumFrameLength + min(searchLimit, Int(UInt8.max)))
    }

    /// Whether bytes of an unfinished frame are buffered.
    public var hasPartialFrame: Bool { !buffer.isEmpty }

    /// How many bytes are buffered; never more than
    /// ``Configuration/maximumBufferedBytes``.
    public var bufferedByteCount: Int { buffer.count }

    /// When the pending partial frame will expire, or `nil` if none is pending
    /// (or there is no idle timeout). Arm the caller's timer with it and call
    /// ``expire(at:)`` when it fires.
    public var deadline: ContinuousClock.Instant? {
        guard hasPartialFrame, let timeout = configuration.idleTimeout, let lastByteAt else { return nil }
        return lastByteAt + timeout
    }

    /// Feeds `bytes` received at `now`, calling `body` for every event
    /// completed, in stream order.
    ///
    /// Before consuming, a partial frame idle (no byte) for longer than the idle
    /// timeout is discarded as ``expire(at:)`` does, so the new bytes are parsed
    /// as the start of a fresh frame. If `body` throws, the error propagates
    /// and the rest of `bytes` is not consumed.
    public mutating func decode<C: Collection>(
        _ bytes: C, at now: ContinuousClock.Instant, _ body: (DecoderEvent) throws -> Void
    ) rethrows where C.Element == UInt8 {
        if let event = expire(at: now) {
            try body(event)
        }
        // An empty write is not a sign of life: it must not postpone the deadline.
        if !bytes.isEmpty {
            lastByteAt = now
        }
        // Bytes left unexamined by a `body` that threw last time come first,
        // even when this call brings no new ones.
        try drain(body)
        for byte in bytes {
            buffer.append(byte)
            try drain(body)
        }
        // A write ended in the middle of a terminator search: show what the
        // text is so far, now, rather than hold it until the stream decides.
        if case .terminatorSearch = phase, examined > provisionalEnd {
            provisionalEnd = examined
            try body(.provisional(.lcdText(line: buffer[2], text: searchText(upTo: examined))))
        }
    }

    /// Bytes of the partial frame arrived at `now` but are held below the
    /// decoder (an HM-10 link holds what may be the module's notice until it
    /// can tell): the frame is not idle, and its timeout counts from here.
    /// Without a partial frame, nothing changes.
    public mutating func noteHeldBytes(at now: ContinuousClock.Instant) {
        guard hasPartialFrame else { return }
        lastByteAt = now
    }

    /// Discards the pending partial frame if it has been idle for longer than
    /// the idle timeout; returns the event if it did.
    ///
    /// The event is ``ProtocolError/partialFrameDiscarded(command:bytes:)``
    /// (answered with ERROR for its command), except during an LCD_TEXT
    /// terminator search: that frame's declared part was complete and only
    /// text followed, so the silence ends the text there and the frame's
    /// message is the event. Either way a timeout yields exactly one event.
    public mutating func expire(at now: ContinuousClock.Instant) -> DecoderEvent? {
        guard let deadline, now > deadline else { return nil }
        if case .terminatorSearch = phase {
            let event = DecoderEvent.message(.lcdText(line: buffer[2], text: searchText(upTo: buffer.count)))
            clear()
            return event
        }
        return reset()
    }

    /// Drops any partial frame, including a terminator search in progress (on
    /// INIT or disconnect). Returns the discard event if something was dropped.
    @discardableResult
    public mutating func reset() -> DecoderEvent? {
        guard let command = buffer.first else { return nil }
        let event = DecoderEvent.error(.partialFrameDiscarded(command: command, bytes: buffer.count))
        clear()
        return event
    }

    // MARK: - State machine

    private mutating func clear() {
        buffer.removeAll(keepingCapacity: true)
        examined = 0
        provisionalEnd = 0
        phase = .header
    }

    /// Bytes that may extend an LCD text whose declared data lacks its 0x00:
    /// printable ASCII, every byte of a multi-byte UTF-8 sequence (or a raw
    /// character-ROM code), and CR, LF, TAB.
    static func isTextByte(_ byte: UInt8) -> Bool {
        (0x20...0x7E).contains(byte) || byte >= 0x80 || byte == 0x0D || byte == 0x0A || byte == 0x09
    }

    /// The text of the LCD frame in the buffer, from after its line byte up
    /// to `end` (or an earlier 0x00).
    private func searchText(upTo end: Int) -> [UInt8] {
        Array(buffer[3..<end].prefix { $0 != 0 })
    }

    /// Examines every buffered byte not examined yet.
    private mutating func drain(_ body: (DecoderEvent) throws -> Void) rethrows {
        while examined < buffer.count {
            if let event = step() {
                try body(event)
            }
        }
    }

    /// Examines the next buffered byte; returns an event if a frame ended there.
    private mutating func step() -> DecoderEvent? {
        let index = examined
        examined += 1
        switch phase {
        case .header:
            // The command byte alone says nothing until the length is known.
            guard index == 1 else { return nil }
            let end = 2 + Int(buffer[1])
            if end == examined {
                return completeDeclaredFrame(end: end)
            }
            phase = .data(end: end)
            return nil
        case .data(let end):
            guard examined == end else { return nil }
            return completeDeclaredFrame(end: end)
        case .terminatorSearch(let declaredEnd):
            let byte = buffer[index]
            if byte == 0 {
                return finishFrame(end: examined, with: .message(lcdText(frameEnd: examined)))
            }
            if !Self.isTextByte(byte) {
                // Not text: the declared bytes are the text, and this byte
                // starts the next frame (the text bytes between are dropped).
                let declared = Message.lcdText(line: buffer[2], text: searchText(upTo: declaredEnd))
                return finishFrame(end: index, with: .message(declared))
            }
            guard examined - declaredEnd == searchLimit else { return nil }
            // No terminator within the limit: the declared text stands, and
            // everything after its declared end is parsed again.
            return finishFrame(end: declaredEnd, with: .message(.lcdText(line: buffer[2], text: searchText(upTo: declaredEnd))))
        }
    }

    /// Decodes the frame whose declared data ends at `end` (all of it buffered),
    /// or starts the LCD_TEXT terminator search.
    private mutating func completeDeclaredFrame(end: Int) -> DecoderEvent? {
        let code = buffer[0]
        let length = buffer[1]
        guard let command = Command(rawValue: code) else {
            return finishFrame(end: end, with: .error(.unknownCommand(code)))
        }
        guard command.validLengths.contains(length) else {
            return finishFrame(end: end, with: .error(.badLength(command: code, length: length)))
        }
        // Lengths are validated above, so every index below is within the frame.
        let message: Message
        switch command {
        case .initialize:
            message = .initialize
        case .analogOutputEnable:
            message = .enable(channel: buffer[2], on: buffer[3] != 0)
        case .servoValue:
            message = .servo(channel: buffer[2], value: bigEndianValue(at: 3))
        case .pwmValue:
            message = .pwm(channel: buffer[2], value: bigEndianValue(at: 3))
        case .lcdText:
            guard buffer[end - 1] == 0 else {
                if searchLimit > 0 {
                    phase = .terminatorSearch(declaredEnd: end)
                    return nil
                }
                // The quirk off: a frame without its 0x00 is what it declares.
                message = .lcdText(line: buffer[2], text: searchText(upTo: end))
                break
            }
            message = lcdText(frameEnd: end)
        case .lcdClear:
            message = .lcdClear
        case .switchValue:
            message = .switchValue(index: buffer[2], on: buffer[3] != 0)
        case .error:
            message = .error(command: buffer[2])
        }
        return finishFrame(end: end, with: .message(message))
    }

    /// The LCD_TEXT message of a frame ending at `frameEnd` in a 0x00.
    private func lcdText(frameEnd: Int) -> Message {
        let text = buffer[3..<frameEnd].prefix { $0 != 0 }
        return .lcdText(line: buffer[2], text: Array(text))
    }

    private func bigEndianValue(at index: Int) -> UInt16 {
        UInt16(buffer[index]) << 8 | UInt16(buffer[index + 1])
    }

    /// Drops the frame's bytes (`0..<end`) and starts the next frame with
    /// whatever follows them in the buffer; returns `event` for convenience.
    private mutating func finishFrame(end: Int, with event: DecoderEvent) -> DecoderEvent {
        if end == buffer.count {
            buffer.removeAll(keepingCapacity: true)
        } else {
            // Only after a failed terminator search, or while parsing its
            // lookahead again: at most `searchLimit` bytes move.
            buffer.removeFirst(end)
        }
        examined = 0
        provisionalEnd = 0
        phase = .header
        return event
    }
}
