import BLEControlProtocol
import TestSupport
import Testing

/// The properties driven by SplitMix64 with fixed seeds: they run on every
/// toolchain (swift-property-based needs Swift ≥ 6.1) and always test the same
/// inputs. A failure names its seed; rerun that one to reproduce it.
@Suite("Properties (seeded)")
struct SeededPropertyTests {
    /// Inputs per property: the work is bounded by this count, never by a
    /// clock (under qemu-user, beside the rest of the suite on a busy
    /// machine, it takes minutes where a second does natively).
    static let iterations: UInt64 = 300

    @Test("encode → decode round-trips every valid message, in any split")
    func roundTrip() {
        for seed in 1...Self.iterations {
            var rng = SplitMix64(seed: seed)
            let messages = (0..<Int.random(in: 0...12, using: &rng)).map { _ in randomMessage(using: &rng) }
            Properties.roundTrip(messages, sizes: randomSizes(using: &rng), context: "seed \(seed)")
        }
    }

    @Test("arbitrary bytes yield the same typed events in any split")
    func splitInvariance() {
        for seed in 1...Self.iterations {
            var rng = SplitMix64(seed: seed &+ 0x1000)
            let bytes = randomBytes(using: &rng)
            let sizes = randomSizes(using: &rng)
            let limit = [0, 1, 4, 40].randomElement(using: &rng)!
            Properties.splitInvariance(bytes, sizes: sizes, textSearchLimit: limit, context: "seed \(seed)")
        }
    }

    @Test("an idle gap resynchronises after any garbage")
    func resynchronisesAfterGap() {
        for seed in 1...Self.iterations {
            var rng = SplitMix64(seed: seed &+ 0x2000)
            let garbage = randomBytes(using: &rng)
            let messages = (0..<Int.random(in: 0...8, using: &rng)).map { _ in randomMessage(using: &rng) }
            Properties.resynchronisesAfterGap(garbage: garbage, then: messages, sizes: randomSizes(using: &rng), context: "seed \(seed)")
        }
    }

    @Test("the original sender's LCD_TEXT frames keep the stream in sync")
    func originalSenderStaysInSync() {
        for seed in 1...Self.iterations {
            var rng = SplitMix64(seed: seed &+ 0x3000)
            let texts = (0..<Int.random(in: 1...6, using: &rng)).map { _ in randomOriginalSenderText(using: &rng) }
            Properties.originalSenderStaysInSync(texts, sizes: randomSizes(using: &rng), context: "seed \(seed)")
        }
    }
}
