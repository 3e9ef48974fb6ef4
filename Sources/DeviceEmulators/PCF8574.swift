import Hardware
import Synchronization

/// An emulated PCF8574 remote 8-bit I/O expander.
///
/// The chip has no registers: every byte of a write message is latched onto
/// the quasi-bidirectional pins P0…P7 at its acknowledge, so a message of n
/// bytes makes n successive port updates, in order (NXP PCF8574/74A data
/// sheet Rev. 5, §8.2 and Fig. 8: "the previous data is overwritten every
/// time a data byte has been sent and acknowledged"; TI SCPS068's prose says
/// later bytes are "ignored", which its own write-mode figure and every
/// LCD backpack in the field contradict). A read returns the pin levels: a
/// pin written high is held up only by a weak current source and reads low
/// when something outside pulls it down; a pin written low reads low. At
/// power-on all pins are high (NXP §8.1).
public final class PCF8574: EmulatedI2CDevice, Sendable {
    private struct Pins {
        var latch: UInt8 = 0xFF
        var writes = 0
        var pulledLow: UInt8 = 0
    }
    private let pins = Mutex(Pins())
    private let onPortWrite: @Sendable (UInt8) -> Void

    /// - Parameter onPortWrite: called after every port update with the new
    ///   port byte, in order (the wiring to whatever hangs on the pins).
    public init(onPortWrite: @escaping @Sendable (UInt8) -> Void = { _ in }) {
        self.onPortWrite = onPortWrite
    }

    /// The output latch: the last byte written (0xFF at power-on).
    public var port: UInt8 { pins.withLock { $0.latch } }

    /// Port updates since power-on.
    public var writeCount: Int { pins.withLock { $0.writes } }

    /// Pins an external circuit drives low; reads see them low even where
    /// the latch is high. Not a port update.
    public var externalLow: UInt8 {
        get { pins.withLock { $0.pulledLow } }
        set { pins.withLock { $0.pulledLow = newValue } }
    }

    /// Power cycle: the latch returns to all-high (NXP §8.1), which
    /// is reported to the wiring as a port update.
    public func powerOn() {
        pins.withLock {
            $0.latch = 0xFF
            $0.writes = 0
        }
        onPortWrite(0xFF)
    }

    public func receive(_ bytes: [UInt8]) {
        for byte in bytes {
            pins.withLock {
                $0.latch = byte
                $0.writes += 1
            }
            // Outside the lock: the wiring may call back into this object
            // (reading `port`), and the bus already serialises transactions.
            onPortWrite(byte)
        }
    }

    public func transmit(count: Int) -> [UInt8] {
        let levels = pins.withLock { $0.latch & ~$0.pulledLow }
        return [UInt8](repeating: levels, count: max(count, 0))
    }
}
