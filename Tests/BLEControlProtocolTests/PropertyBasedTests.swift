#if canImport(PropertyBased)
import BLEControlProtocol
import PropertyBased
import Testing

// The same properties as SeededPropertyTests, driven by swift-property-based
// (only resolvable with Swift ≥ 6.1, see Package.swift): fresh random inputs
// each run, a reproducible seed in every failure (`.fixedSeed(…)`), and
// shrinking of failing inputs where the toolchain enables it. The generators
// are built from the library's own, so shrinking works on each field. Each
// property's work is bounded by its `count` of cases, never by a clock.

/// Any valid message: kind, channel / line, value and text are drawn
/// separately, so each shrinks on its own.
private let messageGenerator = zip(
    Gen.int(in: 0...6),
    Gen.uint8(),
    Gen.uint16(),
    Gen.uint8(in: 1...255).array(of: 0...24)
).map { fields in
    makeMessage(kind: fields.0, channel: fields.1, value: fields.2, text: fields.3)
}

/// Write sizes for `split(_:sizes:)`; 0 is an empty write.
private let sizesGenerator = Gen.int(in: 0...24).array(of: 1...12)

/// Arbitrary bytes, uniform or mapped onto ``protocolishBytes``.
private let bytesGenerator = zip(Gen.bool, Gen.uint8().array(of: 0...300)).map { protocolish, raw in
    protocolish ? raw.map { protocolishBytes[Int($0) % protocolishBytes.count] } : raw
}

/// Lines as a user might type them into the original app.
private let originalTextsGenerator = Gen.int(in: 0...(originalSenderCharacters.count - 1))
    .array(of: 0...16)
    .array(of: 1...6)
    .map { lines in lines.map { originalSenderText(characterIndices: $0) } }

@Suite("Properties (PropertyBased)")
struct PropertyBasedTests {
    @Test("encode → decode round-trips every valid message, in any split")
    func roundTrip() async {
        await propertyCheck(count: 200, input: messageGenerator.array(of: 0...12), sizesGenerator) { messages, sizes in
            Properties.roundTrip(messages, sizes: sizes)
        }
    }

    @Test("a text of any length up to the maximum round-trips")
    func longTextRoundTrip() async {
        await propertyCheck(count: 50, input: Gen.uint8(), Gen.uint8(in: 1...255).array(of: 0...Message.maximumTextLength), sizesGenerator) { line, text, sizes in
            Properties.roundTrip([.lcdText(line: line, text: text)], sizes: sizes)
        }
    }

    @Test("arbitrary bytes yield the same typed events in any split")
    func splitInvariance() async {
        await propertyCheck(count: 300, input: bytesGenerator, sizesGenerator, Gen.int(in: 0...3)) { bytes, sizes, limitIndex in
            Properties.splitInvariance(bytes, sizes: sizes, textSearchLimit: [0, 1, 4, 40][limitIndex])
        }
    }

    @Test("an idle gap resynchronises after any garbage")
    func resynchronisesAfterGap() async {
        await propertyCheck(count: 300, input: bytesGenerator, messageGenerator.array(of: 0...8), sizesGenerator) { garbage, messages, sizes in
            Properties.resynchronisesAfterGap(garbage: garbage, then: messages, sizes: sizes)
        }
    }

    @Test("the original sender's LCD_TEXT frames keep the stream in sync")
    func originalSenderStaysInSync() async {
        await propertyCheck(count: 200, input: originalTextsGenerator, sizesGenerator) { texts, sizes in
            Properties.originalSenderStaysInSync(texts, sizes: sizes)
        }
    }
}
#endif
