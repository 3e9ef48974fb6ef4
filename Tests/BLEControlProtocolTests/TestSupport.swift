import BLEControlProtocol
import TestSupport
import Testing

// Shared fixtures and input generators. The generators take any
// `RandomNumberGenerator`, so the same code feeds the seeded fallback
// (`SplitMix64`, any toolchain) and PropertyBased (Swift ≥ 6.1).

/// One wire vector: a message and the exact bytes docs/protocol.md gives it.
struct GoldenVector: Sendable, CustomStringConvertible {
    let name: String
    let message: Message
    let bytes: [UInt8]

    var description: String { name }
}

/// The frames of docs/protocol.md's table, as the original iOS library sends them.
let goldenVectors: [GoldenVector] = [
    GoldenVector(name: "INIT", message: .initialize, bytes: [0x00, 0x00]),
    GoldenVector(name: "ANALOG_OUT_EN 3 on", message: .enable(channel: 3, on: true), bytes: [0x01, 0x02, 0x03, 0x01]),
    GoldenVector(name: "SERVO_VAL 2 500", message: .servo(channel: 2, value: 500), bytes: [0x02, 0x03, 0x02, 0x01, 0xF4]),
    GoldenVector(name: "PWM_VAL 0 1000", message: .pwm(channel: 0, value: 1000), bytes: [0x03, 0x03, 0x00, 0x03, 0xE8]),
    GoldenVector(
        name: "LCD_TEXT 1 \"Hi\"", message: .lcdText(line: 1, text: Array("Hi".utf8)),
        bytes: [0x04, 0x04, 0x01, 0x48, 0x69, 0x00]
    ),
    GoldenVector(name: "LCD_CLEAR", message: .lcdClear, bytes: [0x05, 0x00]),
    GoldenVector(name: "ERROR 9", message: .error(command: 9), bytes: [0xFF, 0x01, 0x09]),
]

/// A fixed origin for explicit instants; tests never sleep.
let origin = ContinuousClock.now

/// The instant `milliseconds` after ``origin``.
func at(_ milliseconds: Int) -> ContinuousClock.Instant {
    origin + .milliseconds(milliseconds)
}

/// Feeds `chunks` as separate writes, all at one instant, and returns every
/// event in order. Without a time step the idle timeout never fires, so the
/// result depends on the bytes alone.
func decodeEvents(
    _ chunks: [[UInt8]], configuration: FrameDecoder.Configuration = .init()
) -> [DecoderEvent] {
    var decoder = FrameDecoder(configuration: configuration)
    return decodeEvents(chunks, with: &decoder)
}

/// As ``decodeEvents(_:configuration:)``, with the caller's decoder (to
/// inspect its state afterwards). Also checks the buffer bound after every
/// write. Provisional LCD text (shown when a write ends inside a terminator
/// search) is left out: the final events are what must not depend on how the
/// stream was split; ``decodeAllEvents(_:configuration:)`` keeps them.
func decodeEvents(_ chunks: [[UInt8]], with decoder: inout FrameDecoder) -> [DecoderEvent] {
    decodeAllEvents(chunks, with: &decoder).filter {
        if case .provisional = $0 { return false }
        return true
    }
}

/// Every event, provisional text included.
func decodeAllEvents(_ chunks: [[UInt8]], configuration: FrameDecoder.Configuration = .init()) -> [DecoderEvent] {
    var decoder = FrameDecoder(configuration: configuration)
    return decodeAllEvents(chunks, with: &decoder)
}

func decodeAllEvents(_ chunks: [[UInt8]], with decoder: inout FrameDecoder) -> [DecoderEvent] {
    var events: [DecoderEvent] = []
    for chunk in chunks {
        decoder.decode(chunk, at: origin) { events.append($0) }
        #expect(decoder.bufferedByteCount <= decoder.configuration.maximumBufferedBytes)
        #expect(decoder.hasPartialFrame == (decoder.bufferedByteCount > 0))
    }
    return events
}

/// The messages of `events`, or `nil` if any event is an error.
func messages(_ events: [DecoderEvent]) -> [Message]? {
    var result: [Message] = []
    for event in events {
        guard case .message(let message) = event else { return nil }
        result.append(message)
    }
    return result
}

/// `bytes` cut into consecutive writes of the given sizes (cycled; 0 makes
/// an empty write). Every byte appears exactly once, in order.
func split(_ bytes: [UInt8], sizes: [Int]) -> [[UInt8]] {
    // Without a positive size the loop below would never advance.
    guard sizes.contains(where: { $0 > 0 }) else {
        return sizes.map { _ in [] } + [bytes]
    }
    var chunks: [[UInt8]] = []
    var start = 0
    var next = 0
    while start < bytes.count {
        let end = min(bytes.count, start + max(0, sizes[next % sizes.count]))
        chunks.append(Array(bytes[start..<end]))
        start = end
        next += 1
    }
    return chunks
}

/// `bytes` one byte per write, as the slowest possible link delivers them.
func byteByByte(_ bytes: [UInt8]) -> [[UInt8]] {
    bytes.map { [$0] }
}

/// The LCD_TEXT frame exactly as the original iOS library builds it
/// (docs/protocol.md, "Known quirks"): length counts `Character`s, the data is the
/// UTF-8 bytes and a 0x00.
func originalSenderLCDFrame(line: UInt8, text: String) -> [UInt8] {
    [Command.lcdText.rawValue, UInt8(text.count + 2), line] + Array(text.utf8) + [0]
}

// MARK: - Generators

/// Bytes drawn mostly from what frames are made of (command codes, small
/// lengths and channels, 0x00), so random streams hit every decoder path
/// instead of mostly long unknown frames.
let protocolishBytes: [UInt8] = [0, 0, 0, 1, 2, 3, 4, 5, 6, 255, 1, 2, 3, 0x41, 0xC3, 0xA9, 0x80, 0xF4]

/// Sizes of writes; 0 is an empty write, 20 the default ATT payload.
func randomSizes(using rng: inout some RandomNumberGenerator) -> [Int] {
    (0..<Int.random(in: 1...12, using: &rng)).map { _ in Int.random(in: 0...24, using: &rng) }
}

/// An arbitrary byte string, half the time uniform, half the time protocol-ish.
func randomBytes(using rng: inout some RandomNumberGenerator) -> [UInt8] {
    let count = Int.random(in: 0...300, using: &rng)
    if Bool.random(using: &rng) {
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) }
    }
    return (0..<count).map { _ in protocolishBytes.randomElement(using: &rng)! }
}

/// LCD text bytes without 0x00 (which ends a text) of up to `maximumCount` bytes.
func randomText(maximumCount: Int, using rng: inout some RandomNumberGenerator) -> [UInt8] {
    // Mostly display-sized, sometimes up to what a frame can carry.
    let limit = Int.random(in: 0...9, using: &rng) == 0 ? maximumCount : min(maximumCount, 20)
    return (0..<Int.random(in: 0...limit, using: &rng)).map { _ in UInt8.random(in: 1...255, using: &rng) }
}

/// A message from `kind` 0…6 and raw fields; every message it builds encodes
/// to a frame that decodes back to itself.
func makeMessage(kind: Int, channel: UInt8, value: UInt16, text: [UInt8]) -> Message {
    switch kind {
    case 0: return .initialize
    case 1: return .enable(channel: channel, on: value & 1 == 1)
    case 2: return .servo(channel: channel, value: value)
    case 3: return .pwm(channel: channel, value: value)
    case 4: return .lcdText(line: channel, text: text)
    case 5: return .lcdClear
    default: return .error(command: channel)
    }
}

/// Any valid message.
func randomMessage(using rng: inout some RandomNumberGenerator) -> Message {
    makeMessage(
        kind: Int.random(in: 0...6, using: &rng),
        channel: UInt8.random(in: 0...255, using: &rng),
        value: UInt16.random(in: 0...UInt16.max, using: &rng),
        text: randomText(maximumCount: Message.maximumTextLength, using: &rng)
    )
}

/// Characters of 1 to 25 UTF-8 bytes, so the original sender's length is
/// short by 0 to 24 bytes per character.
let originalSenderCharacters: [String] = [
    "A", "z", "0", " ", "~", "é", "ß", "°", "€", "日", "本", "Ω", "👍", "👍🏽", "🇩🇪", "👨‍👩‍👧‍👦",
]

/// The most a line from the original sender may overrun its declared length
/// and still be recovered with the default configuration.
let defaultTextSearchLimit = FrameDecoder.Configuration().textSearchLimit

/// A display line as a user might type it into the original app, built from
/// `originalSenderCharacters[index % count]` and stopped before its quirk
/// overrun would exceed the default search limit.
func originalSenderText(characterIndices: [Int]) -> String {
    var text = ""
    for index in characterIndices {
        let longer = text + originalSenderCharacters[index % originalSenderCharacters.count]
        guard quirkOverrun(longer) <= defaultTextSearchLimit else { break }
        text = longer
    }
    return text
}

/// A random display line as a user might type it into the original app.
func randomOriginalSenderText(using rng: inout some RandomNumberGenerator) -> String {
    let indices = (0..<Int.random(in: 0...16, using: &rng)).map { _ in
        Int.random(in: 0..<originalSenderCharacters.count, using: &rng)
    }
    return originalSenderText(characterIndices: indices)
}

/// How many bytes beyond its declared end the original sender's frame for
/// `text` runs: the UTF-8 bytes its `Character` count does not cover.
func quirkOverrun(_ text: String) -> Int {
    text.utf8.count - text.count
}
