// libFuzzer target: an HM-10's UART stream as the serial transport sorts
// it (HM10Stream), with a session's decoder saying where frames may start
// and its idle timeout running, on virtual time.
//
// The input is a script: centrals one after another, each an OK+CONN
// (the first may have none: a module that does not notify), whole frames of
// every command (LCD texts that spell the notices included), and an end:
// OK+LOST after the last frame, after part of a notice the central wrote
// (`O`, `OK+`, `OK+LO`…), or after a frame cut short (it left in the middle);
// or the stream just stops. The bytes are cut into reads at places and with
// gaps derived from the input: short inside a notice (the module sends one
// in a burst), shorter than the decoder's idle timeout inside a frame,
// anything elsewhere. The checks: every OK+CONN and OK+LOST is seen, in
// order; every byte a central wrote reaches its session, in order, and
// nothing else does; the stream never holds more than its bound, and holds
// nothing once the line has been quiet.
//
// What the stream documents it cannot tell apart is left out of the script:
// a frame's text with two notices back to back, and a long pause right
// after a frame's text spelled a whole notice (docs/protocol.md, "The HM-10
// link").
import BLEControlProtocol
import Firmware
import FuzzSupport

@_cdecl("fuzz_serial_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv, fuzzSerial)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSerial(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let script = Script(bytes)
    var line = Line()
    var random = Cuts(seed: script.seed)
    var index = 0
    while index < script.bytes.count {
        // A read of 1 to 32 bytes, cut short where the gap after a byte is
        // to be long, so the gap's class is the one of the read's last byte.
        let length = Int(random.next() % 32) + 1
        var end = index
        while end < min(script.bytes.count, index + length) {
            end += 1
            if script.gaps[end - 1] != .short, random.next() % 4 == 0 { break }
        }
        line.feed(script.bytes[index..<end])
        line.wait(script.gaps[end - 1].pick(&random))
        index = end
    }
    line.wait(.seconds(2))
    require(line.stream.deadline == nil, "bytes held after the line went quiet: \(line.stream.pending)")
    let expected = merged(script.expected)
    require(line.events == expected, "the stream gave \(line.events), the centrals and the module sent \(expected)")
    return 0
}

/// A failed check, with its message even in a release build (where
/// `precondition` drops it).
func require(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError(message()) }
}

/// How long the line may stay quiet after a byte.
enum Gap {
    /// Inside a notice, or right after a frame's text spelled one.
    case short
    /// Inside a frame: less than the decoder's idle timeout.
    case withinFrame
    /// Anywhere else.
    case any

    func pick(_ random: inout Cuts) -> Duration {
        let roll = random.next()
        // Mostly back to back, as a burst from the module or a write of the central.
        let value = Int64(roll >> 8)
        if roll % 4 != 0 { return .microseconds(value % 5_000) }
        switch self {
        case .short: return .milliseconds(value % 40)
        case .withinFrame: return .milliseconds(value % 400)
        case .any: return .milliseconds(value % 1_500)
        }
    }
}

/// The stream a module and its centrals make, from the fuzzer's bytes, with
/// the events it must sort into.
struct Script {
    private(set) var bytes: [UInt8] = []
    /// The gap allowed after each byte of `bytes`.
    private(set) var gaps: [Gap] = []
    private(set) var expected: [HM10Stream.Event] = []
    let seed: UInt64
    static let notices = [HM10Stream.connectedNotice, HM10Stream.lostNotice]

    init(_ input: [UInt8]) {
        var reader = Reader(input)
        // FNV-1a of the input: the cuts and gaps change with every byte of it.
        seed = input.reduce(0xCBF2_9CE4_8422_2325) { ($0 ^ UInt64($1)) &* 0x100_0000_01B3 }
        var central = 0
        while !reader.isAtEnd, central < 8 {
            if central > 0 || reader.next() & 1 == 0 { notice(HM10Stream.connectedNotice, .connected) }
            var data: [UInt8] = []
            for _ in 0..<reader.next() % 6 { data += Self.frame(&reader) }
            let ending = reader.next() % 4
            switch ending {
            case 1:
                // Part of a notice, as a central's last write.
                let notice = Self.notices[Int(reader.next() & 1)]
                data += notice.prefix(Int(reader.next() % 6) + 1)
            case 2:
                // A frame cut short: the central left in its middle.
                let frame = Self.frame(&reader)
                var cut = Array(frame.prefix(Int(reader.next()) % (frame.count - 1) + 1))
                // A whole notice spelled by the text just before OK+LOST is
                // two notices back to back: one of the documented confusions.
                if Self.notices.contains(where: { cut.ends(with: $0) }) { cut.removeLast() }
                data += cut
            default:
                break
            }
            centralWrites(data)
            // The last central may still be there when the stream stops.
            if !(ending == 3 && reader.isAtEnd) { notice(HM10Stream.lostNotice, .lost) }
            central += 1
        }
    }

    private mutating func notice(_ notice: [UInt8], _ event: HM10Stream.Event) {
        bytes += notice
        gaps += Array(repeating: .short, count: notice.count - 1) + [.any]
        expected.append(event)
    }

    /// A central's bytes: whole frames, then perhaps a partial one or part
    /// of a notice.
    private mutating func centralWrites(_ data: [UInt8]) {
        var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
        for index in data.indices {
            decoder.decode(data[index...index], at: .now) { _ in }
            let sofar = data[...index]
            if Self.notices.contains(where: { sofar.ends(with: $0) }) {
                gaps.append(.short)
            } else {
                gaps.append(decoder.hasPartialFrame && index != data.count - 1 ? .withinFrame : .any)
            }
        }
        bytes += data
        if !data.isEmpty { expected.append(.data(data)) }
    }

    /// A well-formed frame of any command a central sends; its data comes
    /// from the input (the dictionary spells the notices).
    private static func frame(_ reader: inout Reader) -> [UInt8] {
        let code = reader.next() % 7
        let data: [UInt8]
        switch code {
        case 0, 5: data = []
        case 1, 6: data = reader.take(2)
        case 2, 3: data = reader.take(3)
        default:
            // LCD_TEXT: line, text, 0x00.
            var text = reader.take(Int(reader.next() % 24))
            while let range = doubleNotice(in: text) { text[range.lowerBound + HM10Stream.lostNotice.count] = UInt8(ascii: "o") }
            data = [reader.next() % 4] + text + [0x00]
        }
        return [code, UInt8(data.count)] + data
    }

    /// Where `text` spells two notices back to back.
    private static func doubleNotice(in text: [UInt8]) -> Range<Int>? {
        let length = HM10Stream.lostNotice.count
        guard text.count >= 2 * length else { return nil }
        for start in 0...(text.count - 2 * length) {
            let first = text[start..<start + length], second = text[start + length..<start + 2 * length]
            if notices.contains(where: { first.elementsEqual($0) }), notices.contains(where: { second.elementsEqual($0) }) {
                return start..<start + 2 * length
            }
        }
        return nil
    }
}

/// The serial transport's side: the stream, a session's decoder (nil: no
/// session), their timers, on virtual time.
struct Line {
    var stream = HM10Stream()
    var decoder: FrameDecoder?
    var now = ContinuousClock.now
    var events: [HM10Stream.Event] = []

    mutating func feed(_ bytes: ArraySlice<UInt8>) {
        var decoder = self.decoder, events = self.events
        let now = self.now
        stream.feed(bytes, at: now, atFrameBoundary: { !(decoder?.hasPartialFrame ?? false) }) { event in
            Self.handle(event, decoder: &decoder, events: &events, at: now)
        }
        // As the serial transport does: held bytes are a sign of life for the frame.
        if !stream.pending.isEmpty { decoder?.noteHeldBytes(at: now) }
        self.decoder = decoder
        self.events = events
        require(stream.pending.count <= HM10Stream.maximumHeld, "\(stream.pending.count) bytes held")
    }

    /// Lets `duration` pass, firing the transport's hold timer and the
    /// session's idle timer when they are due, in deadline order.
    mutating func wait(_ duration: Duration) {
        let end = now + duration
        while true {
            let hold = stream.deadline.map { $0 + .nanoseconds(1) }
            let idle = decoder?.deadline.map { $0 + .nanoseconds(1) }
            guard let next = [hold, idle].compactMap({ $0 }).min(), next < end else { break }
            now = next
            if next == hold {
                var decoder = self.decoder, events = self.events
                let now = self.now
                stream.expire(at: now) { event in Self.handle(event, decoder: &decoder, events: &events, at: now) }
                self.decoder = decoder
                self.events = events
            } else {
                _ = decoder?.expire(at: now)
            }
        }
        now = end
    }

    /// What the serial transport does with each event: a notice opens or
    /// closes the session, data opens one if there is none and is decoded.
    private static func handle(_ event: HM10Stream.Event, decoder: inout FrameDecoder?, events: inout [HM10Stream.Event], at now: ContinuousClock.Instant) {
        switch event {
        case .connected:
            if decoder == nil { decoder = FrameDecoder() }
        case .lost:
            decoder = nil
        case .data(let bytes):
            if decoder == nil { decoder = FrameDecoder() }
            decoder?.decode(bytes, at: now) { _ in }
        }
        events = merged(events + [event])
    }
}

/// `events` with neighbouring data joined: how the bytes were cut into
/// events is not the stream's promise.
func merged(_ events: [HM10Stream.Event]) -> [HM10Stream.Event] {
    var result: [HM10Stream.Event] = []
    for event in events {
        if case .data(let bytes) = event, case .data(let last)? = result.last {
            result[result.count - 1] = .data(last + bytes)
        } else {
            result.append(event)
        }
    }
    return result
}

struct Reader {
    private let bytes: [UInt8]
    private var index = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var isAtEnd: Bool { index >= bytes.count }

    /// The next byte; zeros once the input is used up.
    mutating func next() -> UInt8 {
        defer { index += 1 }
        return index < bytes.count ? bytes[index] : 0
    }

    mutating func take(_ count: Int) -> [UInt8] { (0..<count).map { _ in next() } }
}

/// A linear congruential generator (Knuth's MMIX constants): the cuts and
/// gaps need only vary with the input, and replay from it alone.
struct Cuts {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return state >> 16
    }
}

extension Collection where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && dropFirst(count - suffix.count).elementsEqual(suffix) }
}
