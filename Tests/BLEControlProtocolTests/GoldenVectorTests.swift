import BLEControlProtocol
import TestSupport
import Testing

/// The byte sequences of docs/protocol.md's frame table, which the original iOS
/// library and STM32 firmware fix: the encoder must produce them and the
/// decoder must accept them however the link cuts them into writes.
@Suite("Golden vectors")
struct GoldenVectorTests {
    @Test("command codes are the original library's")
    func commandCodes() {
        let codes: [(Command, UInt8)] = [
            (.initialize, 0), (.analogOutputEnable, 1), (.servoValue, 2), (.pwmValue, 3),
            (.lcdText, 4), (.lcdClear, 5), (.switchValue, 6), (.error, 255),
        ]
        for (command, code) in codes {
            #expect(command.rawValue == code)
            #expect(Command(rawValue: code) == command)
        }
        #expect(Command.allCases.count == codes.count)
        // 7…254 are reserved for extensions, none of which exists yet.
        for code in UInt8(7)...254 {
            #expect(Command(rawValue: code) == nil)
        }
    }

    @Test("a message names the command it is sent with", arguments: goldenVectors)
    func messageCommand(vector: GoldenVector) {
        #expect(vector.message.command.rawValue == vector.bytes[0])
    }

    @Test("encoder produces the vector", arguments: goldenVectors)
    func encodes(vector: GoldenVector) {
        #expect(FrameEncoder.encode(vector.message) == vector.bytes)
    }

    @Test("encode(_:into:) appends the vector after what the buffer holds", arguments: goldenVectors)
    func encodesInto(vector: GoldenVector) {
        var buffer: [UInt8] = [0xAA, 0xBB]
        FrameEncoder.encode(vector.message, into: &buffer)
        #expect(buffer == [0xAA, 0xBB] + vector.bytes)
    }

    @Test("decoder accepts the vector in one write", arguments: goldenVectors)
    func decodesWhole(vector: GoldenVector) {
        var decoder = FrameDecoder()
        let events = decodeEvents([vector.bytes], with: &decoder)
        #expect(events == [.message(vector.message)])
        #expect(!decoder.hasPartialFrame)
        #expect(decoder.deadline == nil)
    }

    @Test("decoder accepts the vector one byte per write", arguments: goldenVectors)
    func decodesByteByByte(vector: GoldenVector) {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        for (index, byte) in vector.bytes.enumerated() {
            decoder.decode([byte], at: origin) { events.append($0) }
            let isLast = index == vector.bytes.count - 1
            // Nothing is reported before the last byte, and the frame is
            // pending (with a deadline) until it arrives.
            #expect(events.isEmpty == !isLast)
            #expect(decoder.hasPartialFrame == !isLast)
            #expect(decoder.bufferedByteCount == (isLast ? 0 : index + 1))
            #expect((decoder.deadline != nil) == !isLast)
        }
        #expect(events == [.message(vector.message)])
    }

    @Test("decoder accepts the vector in random splits", arguments: goldenVectors)
    func decodesRandomSplits(vector: GoldenVector) {
        for seed in UInt64(1)...64 {
            var rng = SplitMix64(seed: seed)
            let chunks = split(vector.bytes, sizes: randomSizes(using: &rng))
            #expect(decodeEvents(chunks) == [.message(vector.message)], "seed \(seed), writes \(chunks)")
        }
    }

    @Test("decoder accepts the vector merged with its neighbours in one write", arguments: goldenVectors.indices)
    func decodesWithNeighbours(index: Int) {
        let count = goldenVectors.count
        let neighbourhood = [goldenVectors[(index + count - 1) % count], goldenVectors[index], goldenVectors[(index + 1) % count]]
        let stream = neighbourhood.flatMap(\.bytes)
        #expect(decodeEvents([stream]) == neighbourhood.map { .message($0.message) })
    }

    @Test("decoder accepts all vectors in one write, and that stream in any split")
    func decodesAllMerged() {
        let stream = goldenVectors.flatMap(\.bytes)
        let expected = goldenVectors.map { DecoderEvent.message($0.message) }
        #expect(decodeEvents([stream]) == expected)
        #expect(decodeEvents(byteByByte(stream)) == expected)
        // The default ATT MTU leaves 20 bytes per write.
        #expect(decodeEvents(split(stream, sizes: [20])) == expected)
        for seed in UInt64(1)...256 {
            var rng = SplitMix64(seed: seed)
            let chunks = split(stream, sizes: randomSizes(using: &rng))
            #expect(decodeEvents(chunks) == expected, "seed \(seed), writes \(chunks)")
        }
    }

    @Test("ANALOG_OUT_EN treats every nonzero enable byte as on")
    func enableIsAnyNonzero() {
        #expect(decodeEvents([[0x01, 0x02, 0x07, 0x00]]) == [.message(.enable(channel: 7, on: false))])
        for enable in UInt8(1)...255 {
            #expect(decodeEvents([[0x01, 0x02, 0x07, enable]]) == [.message(.enable(channel: 7, on: true))])
        }
        // The encoder sends the original's 0 / 1.
        #expect(FrameEncoder.encode(.enable(channel: 7, on: false)) == [0x01, 0x02, 0x07, 0x00])
    }

    @Test("SERVO_VAL and PWM_VAL values are big-endian u16 over their whole range")
    func valuesAreBigEndian() {
        for value: UInt16 in [0, 1, 0x00FF, 0x0100, 1000, 0x1234, 0xFFFF] {
            let servo = FrameEncoder.encode(.servo(channel: 15, value: value))
            #expect(servo == [0x02, 0x03, 0x0F, UInt8(value >> 8), UInt8(value & 0xFF)])
            #expect(decodeEvents([servo]) == [.message(.servo(channel: 15, value: value))])
            let pwm = FrameEncoder.encode(.pwm(channel: 15, value: value))
            #expect(pwm == [0x03, 0x03, 0x0F, UInt8(value >> 8), UInt8(value & 0xFF)])
            #expect(decodeEvents([pwm]) == [.message(.pwm(channel: 15, value: value))])
        }
    }
}
