// libFuzzer target: the frame decoder (scripts/fuzz builds and runs it).
//
// Beyond "no crash, no hang", it checks what the decoder promises
// (FrameDecoder's documentation): the events are the same however the
// stream is split into writes; the buffer never holds more than its bound;
// every frame it accepts re-encodes to a frame that decodes to itself
// (its LCD text cut to what a frame can declare).
import BLEControlProtocol
import FuzzSupport

@_cdecl("fuzz_frames_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv, fuzzFrames)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let now = ContinuousClock.now
    // The same instant for every write: no partial frame expires, so the
    // split is the only difference between the two runs.
    let whole = FuzzFrames.decode(bytes, writes: [bytes.count], at: now)
    let split = FuzzFrames.decode(bytes, writes: FuzzFrames.splits(of: bytes), at: now)
    precondition(whole == split, "events depend on how the stream was split: \(whole) vs \(split)")
    for case .message(let message) in whole {
        let encoded = FrameEncoder.encode(message)
        let again = FuzzFrames.decode(encoded, writes: [encoded.count], at: now)
        // A frame the LCD_TEXT quirk extended may carry more text than a
        // length byte can declare; the encoder keeps what fits.
        var expected = message
        if case .lcdText(let line, let text) = message, text.count > Message.maximumTextLength {
            expected = .lcdText(line: line, text: Array(text.prefix(Message.maximumTextLength)))
        }
        precondition(again == [.message(expected)], "\(message) re-encoded as \(encoded) decodes to \(again)")
    }
    return 0
}

enum FuzzFrames {
    /// The final events of decoding `bytes` in writes of the given lengths
    /// (provisional LCD text left out: it depends on the split by design),
    /// then the discard of whatever partial frame is left.
    static func decode(_ bytes: [UInt8], writes: [Int], at now: ContinuousClock.Instant) -> [DecoderEvent] {
        var decoder = FrameDecoder()
        var events: [DecoderEvent] = []
        var start = 0
        for length in writes {
            decoder.decode(bytes[start..<start + length], at: now) { event in
                if case .provisional = event { return }
                events.append(event)
            }
            precondition(decoder.bufferedByteCount <= decoder.configuration.maximumBufferedBytes,
                         "decoder holds \(decoder.bufferedByteCount) bytes, bound \(decoder.configuration.maximumBufferedBytes)")
            start += length
        }
        // The search for an LCD terminator ends with the stream: what expiry
        // would report is the frame's final event.
        if let event = decoder.expire(at: now + .seconds(3600)) { events.append(event) }
        return events
    }

    /// Write lengths derived from the input itself, so a crash reproduces
    /// from the input alone.
    static func splits(of bytes: [UInt8]) -> [Int] {
        var lengths: [Int] = []
        var remaining = bytes.count
        var seed = UInt64(bytes.count) &* 0x9E37_79B9_7F4A_7C15
        for byte in bytes { seed = (seed ^ UInt64(byte)) &* 0x100_0000_01B3 }
        while remaining > 0 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let length = min(remaining, Int(seed >> 59) + 1)
            lengths.append(length)
            remaining -= length
        }
        return lengths
    }
}

