import BLEControlProtocol
import TestSupport
import Testing

/// A frame that cannot be decoded, with the error it must yield.
struct BadFrame: Sendable, CustomStringConvertible {
    let bytes: [UInt8]
    let error: ProtocolError

    var description: String {
        "\(bytes) → \(error)"
    }
}

/// Known commands with lengths they do not accept, and unknown commands;
/// each carries exactly the data its length byte declares.
let badFrames: [BadFrame] = [
    BadFrame(bytes: [0x00, 0x01, 0xAA], error: .badLength(command: 0, length: 1)),
    BadFrame(bytes: [0x01, 0x01, 0x03], error: .badLength(command: 1, length: 1)),
    BadFrame(bytes: [0x01, 0x03, 0x03, 0x01, 0x00], error: .badLength(command: 1, length: 3)),
    BadFrame(bytes: [0x02, 0x02, 0x01, 0xF4], error: .badLength(command: 2, length: 2)),
    BadFrame(bytes: [0x02, 0x00], error: .badLength(command: 2, length: 0)),
    BadFrame(bytes: [0x03, 0x04, 0x00, 0x03, 0xE8, 0x00], error: .badLength(command: 3, length: 4)),
    BadFrame(bytes: [0x04, 0x00], error: .badLength(command: 4, length: 0)),
    BadFrame(bytes: [0x04, 0x01, 0x00], error: .badLength(command: 4, length: 1)),
    BadFrame(bytes: [0x05, 0x02, 0x00, 0x00], error: .badLength(command: 5, length: 2)),
    BadFrame(bytes: [0xFF, 0x00], error: .badLength(command: 255, length: 0)),
    BadFrame(bytes: [0xFF, 0x02, 0x09, 0x09], error: .badLength(command: 255, length: 2)),
    BadFrame(bytes: [0x07, 0x00], error: .unknownCommand(7)),
    BadFrame(bytes: [0x06, 0x00], error: .badLength(command: 6, length: 0)),
    BadFrame(bytes: [0x07, 0x02, 0x01, 0x00], error: .unknownCommand(7)),
    BadFrame(bytes: [0xFE, 0x01, 0x00], error: .unknownCommand(254)),
    // Declared data that looks like valid frames is still skipped as data.
    BadFrame(bytes: [0x80, 0xFF] + Array(Array(repeating: goldenVectors.flatMap(\.bytes), count: 10).joined().prefix(255)), error: .unknownCommand(0x80)),
]

@Suite("Decoder errors and resynchronisation")
struct DecoderErrorTests {
    // MARK: Bad frames

    @Test("a bad frame yields its error, then decoding resumes after its declared end", arguments: badFrames)
    func badFrameThenResync(frame: BadFrame) {
        let servo = goldenVectors[2]
        let stream = servo.bytes + frame.bytes + servo.bytes
        let expected: [DecoderEvent] = [.message(servo.message), .error(frame.error), .message(servo.message)]
        #expect(decodeEvents([stream]) == expected)
        #expect(decodeEvents(byteByByte(stream)) == expected)
        for seed in UInt64(1)...16 {
            var rng = SplitMix64(seed: seed)
            #expect(decodeEvents(split(stream, sizes: randomSizes(using: &rng))) == expected, "seed \(seed)")
        }
    }

    @Test("a bad frame is reported only once its declared data has arrived", arguments: badFrames)
    func badFrameWaitsForDeclaredData(frame: BadFrame) {
        var decoder = FrameDecoder()
        let events = decodeEvents([Array(frame.bytes.dropLast())], with: &decoder)
        #expect(events.isEmpty)
        #expect(decoder.bufferedByteCount == frame.bytes.count - 1)
    }

    @Test("the ERROR reply names the offending command byte", arguments: badFrames)
    func errorReply(frame: BadFrame) throws {
        let reply = try #require(frame.error.replyCommand)
        #expect(reply == frame.bytes[0])
        #expect(FrameEncoder.encode(.error(command: reply)) == [0xFF, 0x01, frame.bytes[0]])
    }

    @Test("reply commands: every error names its command, an expired partial frame too")
    func replyCommands() {
        #expect(ProtocolError.unknownCommand(42).replyCommand == 42)
        #expect(ProtocolError.badLength(command: 2, length: 9).replyCommand == 2)
        // docs/protocol.md: a partial frame that expires was not executed; its
        // sender hears so (after a disconnect the session drops the reply).
        #expect(ProtocolError.partialFrameDiscarded(command: 2, bytes: 3).replyCommand == 2)
    }

    @Test("bad frames between good ones, in any split, cost only themselves")
    func mixedStream() {
        var stream: [UInt8] = []
        var expected: [DecoderEvent] = []
        for (index, vector) in goldenVectors.enumerated() {
            stream += vector.bytes
            expected.append(.message(vector.message))
            let bad = badFrames[index % badFrames.count]
            stream += bad.bytes
            expected.append(.error(bad.error))
        }
        #expect(decodeEvents([stream]) == expected)
        #expect(decodeEvents(byteByByte(stream)) == expected)
        for seed in UInt64(1)...64 {
            var rng = SplitMix64(seed: seed)
            #expect(decodeEvents(split(stream, sizes: randomSizes(using: &rng))) == expected, "seed \(seed)")
        }
    }

    // MARK: Idle timeout

    @Test("a partial frame idle past the timeout is discarded before new bytes are parsed")
    func idlePartialFrameIsDiscarded() {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        // SERVO_VAL split over two writes without response; the second is lost.
        decoder.decode([0x02, 0x03, 0x01], at: at(0)) { events.append($0) }
        #expect(decoder.deadline == at(500))
        decoder.decode([0x02, 0x03, 0x04, 0x01, 0xF4], at: at(600)) { events.append($0) }
        #expect(events == [
            .error(.partialFrameDiscarded(command: 2, bytes: 3)),
            .message(.servo(channel: 4, value: 500)),
        ])
        #expect(!decoder.hasPartialFrame)
    }

    @Test("without the gap the same bytes would shift the stream")
    func noGapNoDiscard() {
        // Same writes as above, but in quick succession: the decoder cannot know
        // a write was lost, which is exactly why the timeout exists.
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        decoder.decode([0x02, 0x03, 0x01], at: at(0)) { events.append($0) }
        decoder.decode([0x02, 0x03, 0x04, 0x01, 0xF4], at: at(20)) { events.append($0) }
        // 02 03 | 01 02 03 is taken for SERVO_VAL, and 04 01 F4 for an LCD_TEXT
        // with a bad length: one frame lost becomes two wrong ones.
        #expect(events == [.message(.servo(channel: 1, value: 0x0203)), .error(.badLength(command: 4, length: 1))])
    }

    @Test("the timeout counts from the last byte, and is strict")
    func timeoutCountsFromLastByte() {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        decoder.decode([0x02], at: at(0)) { events.append($0) }
        decoder.decode([0x03], at: at(400)) { events.append($0) }
        decoder.decode([0x01], at: at(800)) { events.append($0) }
        #expect(decoder.deadline == at(1300))
        #expect(decoder.expire(at: at(1300)) == nil)
        decoder.decode([0x01, 0xF4], at: at(1300)) { events.append($0) }
        #expect(events == [.message(.servo(channel: 1, value: 500))])
        #expect(decoder.deadline == nil)
    }

    @Test("expire(at:) discards once the deadline has passed, and only then")
    func expireDiscards() {
        var decoder = FrameDecoder(configuration: .init(idleTimeout: .milliseconds(100)))
        decoder.decode([0x04, 0x06, 0x00, 0x41], at: at(0)) { _ in Issue.record("no event expected") }
        #expect(decoder.deadline == at(100))
        #expect(decoder.expire(at: at(50)) == nil)
        #expect(decoder.expire(at: at(100)) == nil)
        #expect(decoder.expire(at: at(101)) == .error(.partialFrameDiscarded(command: 4, bytes: 4)))
        #expect(!decoder.hasPartialFrame)
        #expect(decoder.deadline == nil)
        // Nothing left to expire.
        #expect(decoder.expire(at: at(10_000)) == nil)
        #expect(decodeEvents(byteByByte(goldenVectors[4].bytes), with: &decoder) == [.message(goldenVectors[4].message)])
    }

    @Test("an empty write does not postpone the deadline")
    func emptyWriteIsNotActivity() {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        decoder.decode([0x02, 0x03], at: at(0)) { events.append($0) }
        decoder.decode([], at: at(400)) { events.append($0) }
        #expect(decoder.deadline == at(500))
        decoder.decode([], at: at(501)) { events.append($0) }
        #expect(events == [.error(.partialFrameDiscarded(command: 2, bytes: 2))])
    }

    @Test("with no idle timeout a partial frame waits forever")
    func noTimeout() {
        var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
        var events: [DecoderEvent] = []
        decoder.decode([0x02, 0x03, 0x01], at: at(0)) { events.append($0) }
        #expect(decoder.deadline == nil)
        #expect(decoder.expire(at: at(3_600_000)) == nil)
        decoder.decode([0x01, 0xF4], at: at(3_600_000)) { events.append($0) }
        #expect(events == [.message(.servo(channel: 1, value: 500))])
    }

    @Test("a timeout during the LCD_TEXT terminator search ends the text where it stands")
    func timeoutDuringTerminatorSearch() {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        // The original sender's "é" frame, with its terminator lost.
        decoder.decode([0x04, 0x03, 0x02, 0xC3], at: at(0)) { events.append($0) }
        #expect(events.isEmpty, "the declared data is not all in yet")
        decoder.decode([0xA9], at: at(10)) { events.append($0) }
        // The declared data is in, without its 0x00: shown at once.
        #expect(events == [.provisional(.lcdText(line: 2, text: [0xC3, 0xA9]))])
        #expect(decoder.expire(at: at(511)) == .message(.lcdText(line: 2, text: [0xC3, 0xA9])))
        #expect(!decoder.hasPartialFrame)
        events.removeAll()
        decoder.decode(goldenVectors[5].bytes, at: at(600)) { events.append($0) }
        #expect(events == [.message(.lcdClear)])
    }

    @Test("reset() drops a partial frame and reports it; with nothing pending it reports nothing")
    func reset() {
        var decoder = FrameDecoder()
        #expect(decoder.reset() == nil)
        _ = decodeEvents([[0x03, 0x03, 0x00]], with: &decoder)
        #expect(decoder.reset() == .error(.partialFrameDiscarded(command: 3, bytes: 3)))
        #expect(!decoder.hasPartialFrame)
        #expect(decoder.bufferedByteCount == 0)
        #expect(decoder.reset() == nil)
        // A terminator search in progress goes too, lookahead included.
        _ = decodeEvents([[0x04, 0x03, 0x00, 0xC3, 0xA9, 0xC3]], with: &decoder)
        #expect(decoder.reset() == .error(.partialFrameDiscarded(command: 4, bytes: 6)))
        #expect(decodeEvents([goldenVectors[3].bytes], with: &decoder) == [.message(goldenVectors[3].message)])
    }

    // MARK: LCD_TEXT quirk of the original sender

    @Test(
        "the original sender's LCD_TEXT frames decode, and the stream stays in sync",
        arguments: ["Hi", "", "Grüße", "é", "日本語", "👍🏽", "°C", "€ 1,50",
                    String(repeating: "日", count: 16), String(repeating: "日", count: 20), "🇩🇪 👨‍👩‍👧‍👦"]
    )
    func originalSenderText(text: String) {
        let frame = originalSenderLCDFrame(line: 1, text: text)
        let servo = goldenVectors[2]
        let stream = frame + servo.bytes + frame
        let lcd = DecoderEvent.message(.lcdText(line: 1, text: Array(text.utf8)))
        let expected = [lcd, .message(servo.message), lcd]
        #expect(decodeEvents([stream]) == expected)
        #expect(decodeEvents(byteByByte(stream)) == expected)
        for seed in UInt64(1)...16 {
            var rng = SplitMix64(seed: seed)
            #expect(decodeEvents(split(stream, sizes: randomSizes(using: &rng))) == expected, "seed \(seed)")
        }
    }

    @Test("for ASCII the original sender's length is exact, and matches the encoder")
    func asciiMatchesEncoder() {
        let text = "Hello, world 42!"
        #expect(originalSenderLCDFrame(line: 0, text: text) == FrameEncoder.encode(.lcdText(line: 0, text: Array(text.utf8))))
    }

    @Test("an earlier 0x00 in the declared data only ends the text")
    func earlyTerminator() {
        // "A", 0x00, "B", 0x00: what the original sender makes of "A\u{0}B".
        #expect(originalSenderLCDFrame(line: 1, text: "A\u{0}B") == [0x04, 0x05, 0x01, 0x41, 0x00, 0x42, 0x00])
        let stream = originalSenderLCDFrame(line: 1, text: "A\u{0}B") + goldenVectors[5].bytes
        #expect(decodeEvents([stream]) == [.message(.lcdText(line: 1, text: [0x41])), .message(.lcdClear)])
        #expect(decodeEvents([[0x04, 0x02, 0x03, 0x00]]) == [.message(.lcdText(line: 3, text: []))])
    }

    // MARK: Text search limit

    @Test("the terminator may be at most textSearchLimit bytes past the declared end")
    func searchLimitBoundary() {
        let configuration = FrameDecoder.Configuration(textSearchLimit: 4)
        // Declared data 01 41 42; four more bytes, the last one the terminator.
        let fits: [UInt8] = [0x04, 0x03, 0x01, 0x41, 0x42, 0x43, 0x44, 0x45, 0x00]
        #expect(decodeEvents([fits], configuration: configuration) == [.message(.lcdText(line: 1, text: [0x41, 0x42, 0x43, 0x44, 0x45]))])
        #expect(decodeEvents(byteByByte(fits), configuration: configuration) == [.message(.lcdText(line: 1, text: [0x41, 0x42, 0x43, 0x44, 0x45]))])

        // One text byte further: the declared text stands, and the bytes
        // looked at are parsed again (here they open a frame of command 0x43).
        let tooFar: [UInt8] = [0x04, 0x03, 0x01, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x00]
        let expected: [DecoderEvent] = [.message(.lcdText(line: 1, text: [0x41, 0x42]))]
        var whole = FrameDecoder(configuration: configuration)
        #expect(decodeEvents([tooFar], with: &whole) == expected)
        #expect(whole.reset() == .error(.partialFrameDiscarded(command: 0x43, bytes: 5)))
        #expect(decodeEvents(byteByByte(tooFar), configuration: configuration) == expected)
    }

    // MARK: docs/protocol.md's LCD_TEXT rule, case by case

    @Test("a hand-typed frame with the right length and no 0x00 is shown at once and never swallows the next frame")
    func handTypedWithoutTerminator() {
        let frame: [UInt8] = [0x04, 0x04, 0x00, 0x41, 0x42, 0x43]
        let servo: [UInt8] = [0x02, 0x03, 0x00, 0x01, 0xF4]
        let expected: [DecoderEvent] = [.message(.lcdText(line: 0, text: Array("ABC".utf8))), .message(.servo(channel: 0, value: 500))]
        #expect(decodeEvents([frame + servo]) == expected)
        #expect(decodeEvents([frame, servo]) == expected)
        #expect(decodeEvents(byteByByte(frame + servo)) == expected)
        // Alone in its write (nRF Connect, LightBlue): on the display at once.
        #expect(decodeAllEvents([frame]) == [.provisional(.lcdText(line: 0, text: Array("ABC".utf8)))])
    }

    @Test("the original library's \\r\\n miscount extends across the text to its 0x00")
    func carriageReturnMiscount() {
        let frame: [UInt8] = [0x04, 0x05, 0x00, 0x61, 0x0D, 0x0A, 0x62, 0x00]
        #expect(originalSenderLCDFrame(line: 0, text: "a\r\nb") == frame)
        #expect(decodeEvents([frame + [0x05, 0x00]]) == [.message(.lcdText(line: 0, text: [0x61, 0x0D, 0x0A, 0x62])), .message(.lcdClear)])
    }

    @Test("a control byte other than CR, LF and TAB ends the search: it starts the next frame")
    func controlByteEndsSearch() {
        let stream: [UInt8] = [0x04, 0x03, 0x00, 0x41, 0x42, 0x05, 0x00]
        #expect(decodeEvents([stream]) == [.message(.lcdText(line: 0, text: [0x41, 0x42])), .message(.lcdClear)])
        // Text bytes between the declared end and the control byte are dropped.
        let withTail: [UInt8] = [0x04, 0x03, 0x00, 0x41, 0x42, 0x43, 0x01, 0x02, 0x00, 0x01]
        #expect(decodeEvents([withTail]) == [.message(.lcdText(line: 0, text: [0x41, 0x42])), .message(.enable(channel: 0, on: true))])
    }

    @Test("frames after an unterminated text are recovered, not lost")
    func framesAfterUnterminatedTextSurvive() {
        // 0x00-free frames right after the declared text: the first command
        // byte ends the search.
        let servos = (UInt8(1)...12).map { Message.servo(channel: $0, value: 0x0101 * UInt16($0)) }
        let stream: [UInt8] = [0x04, 0x03, 0x02, 0x41, 0x42] + servos.flatMap { FrameEncoder.encode($0) }
        #expect(!stream.dropFirst(5).contains(0))
        let expected = [DecoderEvent.message(.lcdText(line: 2, text: [0x41, 0x42]))] + servos.map { .message($0) }
        #expect(decodeEvents([stream]) == expected)
        #expect(decodeEvents(byteByByte(stream)) == expected)
        for seed in UInt64(1)...16 {
            var rng = SplitMix64(seed: seed)
            #expect(decodeEvents(split(stream, sizes: randomSizes(using: &rng))) == expected, "seed \(seed)")
        }
    }

    @Test("an original-sender line overrunning the default limit keeps its declared text; an idle gap resynchronises")
    func overrunBeyondDefaultLimit() {
        let text = String(repeating: "日", count: 21)
        #expect(quirkOverrun(text) == 42)
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        decoder.decode(originalSenderLCDFrame(line: 0, text: text), at: at(0)) { events.append($0) }
        #expect(events.first == .message(.lcdText(line: 0, text: Array(Array(text.utf8).prefix(22)))))
        #expect(decoder.bufferedByteCount <= decoder.configuration.maximumBufferedBytes)
        events = []
        decoder.decode(goldenVectors[1].bytes, at: at(1000)) { events.append($0) }
        #expect(events.last == .message(goldenVectors[1].message))
    }

    @Test("textSearchLimit 0 (or less) turns the quirk off", arguments: [0, -5])
    func quirkOff(limit: Int) {
        let configuration = FrameDecoder.Configuration(textSearchLimit: limit)
        #expect(configuration.maximumBufferedBytes == 257)
        var decoder = FrameDecoder(configuration: configuration)
        // What it declares, as soon as the declared data is in.
        #expect(decodeEvents([[0x04, 0x03, 0x01, 0x41, 0x42]], with: &decoder) == [.message(.lcdText(line: 1, text: [0x41, 0x42]))])
        #expect(!decoder.hasPartialFrame)
        // The original sender's "é" frame then leaves its terminator behind,
        // which opens a bogus INIT frame of length 5 (the LCD_CLEAR's 0x05):
        // the desynchronisation the quirk handling exists to prevent.
        var quirkless = FrameDecoder(configuration: configuration)
        let stream = originalSenderLCDFrame(line: 1, text: "é") + goldenVectors[5].bytes
        #expect(decodeEvents([stream], with: &quirkless) == [.message(.lcdText(line: 1, text: [0xC3, 0xA9]))])
        #expect(quirkless.reset() == .error(.partialFrameDiscarded(command: 0, bytes: 3)))
        #expect(decodeEvents([stream]) == [.message(.lcdText(line: 1, text: Array("é".utf8))), .message(.lcdClear)])
    }

    @Test("the buffer bound holds for any search limit")
    func bufferBound() {
        #expect(FrameDecoder.Configuration().maximumBufferedBytes == 257 + 40)
        #expect(FrameDecoder.Configuration(textSearchLimit: .max).maximumBufferedBytes == .max)
        // Longest frame plus a full unsuccessful search.
        var decoder = FrameDecoder()
        let longest: [UInt8] = [0x04, 0xFF] + Array(repeating: 0x41, count: 255)
        _ = decodeEvents([longest + Array(repeating: 0x42, count: 39)], with: &decoder)
        #expect(decoder.bufferedByteCount == 257 + 39)
    }

    // MARK: Encoder limits

    @Test("the longest LCD text fills the length byte and round-trips")
    func longestText() {
        let text = Array(repeating: UInt8(0x41), count: Message.maximumTextLength)
        let frame = FrameEncoder.encode(.lcdText(line: 0, text: text))
        #expect(frame.count == 2 + 255)
        #expect(frame[1] == 255)
        #expect(decodeEvents([frame]) == [.message(.lcdText(line: 0, text: text))])
    }

    @Test("the encoder cuts text at a 0x00 and at the longest a frame carries")
    func encoderCutsText() {
        #expect(FrameEncoder.encode(.lcdText(line: 1, text: [0x48, 0x00, 0x69])) == [0x04, 0x03, 0x01, 0x48, 0x00])
        let tooLong = Array(repeating: UInt8(0x41), count: Message.maximumTextLength + 10)
        let frame = FrameEncoder.encode(.lcdText(line: 0, text: tooLong))
        #expect(frame == [0x04, 0xFF, 0x00] + tooLong.prefix(Message.maximumTextLength) + [0x00])
    }
}
