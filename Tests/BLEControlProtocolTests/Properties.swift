import BLEControlProtocol
import Testing

// The properties themselves, as plain functions that record issues. Two
// drivers feed them: SeededPropertyTests (own PRNG, every toolchain) and
// PropertyBasedTests (swift-property-based, Swift ≥ 6.1, with shrinking).
// `context` names the input (the seed) in every failure; PropertyBased
// reports its own seed and input, so it passes none.

enum Properties {
    /// Valid messages, encoded back to back and delivered in any split, decode
    /// to exactly themselves; each one alone decodes to itself.
    static func roundTrip(_ messages: [Message], sizes: [Int], context: Comment? = nil) {
        for message in messages {
            #expect(decodeEvents([FrameEncoder.encode(message)]) == [.message(message)], context)
        }
        var stream: [UInt8] = []
        for message in messages {
            FrameEncoder.encode(message, into: &stream)
        }
        var decoder = FrameDecoder()
        let events = decodeEvents(split(stream, sizes: sizes), with: &decoder)
        #expect(events == messages.map { .message($0) }, context)
        #expect(!decoder.hasPartialFrame, context)
    }

    /// Any byte string yields only messages and well-founded errors, and the
    /// same events whether it arrives whole, byte by byte or in `sizes` writes
    /// (no time passes, so the idle timeout plays no part).
    static func splitInvariance(_ bytes: [UInt8], sizes: [Int], textSearchLimit: Int, context: Comment? = nil) {
        let configuration = FrameDecoder.Configuration(textSearchLimit: textSearchLimit)
        var wholeDecoder = FrameDecoder(configuration: configuration)
        let whole = decodeEvents([bytes], with: &wholeDecoder)
        var splitDecoder = FrameDecoder(configuration: configuration)
        let pieces = decodeEvents(split(bytes, sizes: sizes), with: &splitDecoder)
        #expect(pieces == whole, context)
        #expect(decodeEvents(byteByByte(bytes), configuration: configuration) == whole, context)
        // Whatever is left over is the same, too.
        #expect(splitDecoder.bufferedByteCount == wholeDecoder.bufferedByteCount, context)
        #expect(splitDecoder.reset() == wholeDecoder.reset(), context)

        for event in whole {
            switch event {
            case .message(let message):
                // A decoded message is in normal form: it survives a round trip.
                #expect(decodeEvents([FrameEncoder.encode(message)]) == [.message(message)], context)
            case .error(.unknownCommand(let code)):
                #expect(Command(rawValue: code) == nil, context)
            case .error(.badLength(let code, let length)):
                let command = Command(rawValue: code)
                #expect(command != nil, context)
                #expect(command?.validLengths.contains(length) == false, context)
            case .provisional:
                Issue.record("decodeEvents keeps only final events; \(context ?? "")")
            case .error(.partialFrameDiscarded):
                Issue.record("a partial frame was discarded although no time passed; \(context ?? "")")
            }
        }
    }

    /// After any garbage, one idle gap is enough: the frames sent after it
    /// decode exactly, preceded by at most the event that drops the stale bytes.
    static func resynchronisesAfterGap(garbage: [UInt8], then messages: [Message], sizes: [Int], context: Comment? = nil) {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        for chunk in split(garbage, sizes: sizes) {
            decoder.decode(chunk, at: at(0)) { _ in }
        }
        let hadPartialFrame = decoder.hasPartialFrame
        let chunks = split(messages.flatMap { FrameEncoder.encode($0) }, sizes: sizes)
        for chunk in chunks {
            decoder.decode(chunk, at: at(1000)) { events.append($0) }
        }
        let expected = messages.map { DecoderEvent.message($0) }
        // With no write after the gap there is nothing to notice it; any
        // write, even an empty one, does.
        if hadPartialFrame && !chunks.isEmpty {
            guard let first = events.first else {
                Issue.record("the stale partial frame was not reported; \(context ?? "")")
                return
            }
            switch first {
            // A stale partial frame is dropped; a stale text search ends with
            // the text it had.
            case .error(.partialFrameDiscarded), .message(.lcdText):
                break
            default:
                Issue.record("unexpected first event \(first); \(context ?? "")")
            }
            #expect(Array(events.dropFirst()) == expected, context)
        } else {
            #expect(events == expected, context)
        }
    }

    /// The original sender's LCD_TEXT frames (length counting `Character`s),
    /// mixed with other frames, decode to their UTF-8 text and keep the stream
    /// in sync, as long as each overruns by no more than the search limit.
    static func originalSenderStaysInSync(_ texts: [String], sizes: [Int], context: Comment? = nil) {
        var stream: [UInt8] = []
        var expected: [DecoderEvent] = []
        for (index, text) in texts.enumerated() {
            let line = UInt8(index % 4)
            stream += originalSenderLCDFrame(line: line, text: text)
            expected.append(.message(.lcdText(line: line, text: Array(text.utf8))))
            let servo = Message.servo(channel: line, value: UInt16(index) * 100)
            stream += FrameEncoder.encode(servo)
            expected.append(.message(servo))
        }
        #expect(decodeEvents(split(stream, sizes: sizes)) == expected, context)
    }
}
