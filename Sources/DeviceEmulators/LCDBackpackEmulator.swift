import Reactor
import Hardware

/// A character LCD module with a PCF8574 I2C backpack: the expander's port
/// pins wired to an ``HD44780Emulator`` through a pin map, as on the board.
///
/// Attach it to an ``EmulatedI2CBus`` at the backpack's address; the
/// emulated screen is ``lcd``'s ``HD44780Emulator/lines``.
public final class LCDBackpackEmulator: EmulatedI2CDevice {
    /// The controller on the module.
    public let lcd: HD44780Emulator
    /// The I2C side.
    public let expander: PCF8574
    /// How the port bits reach the LCD's inputs.
    public let pinMap: PCF8574PinMap

    /// A module just powered on: the expander drives every pin high (NXP
    /// PCF8574 §8.1) and the controller is in its reset state.
    ///
    /// - Parameters:
    ///   - columns, rows: the glass.
    ///   - pinMap: the backpack's wiring.
    ///   - timing: enables the controller's timing checks (see
    ///     ``HD44780Emulator/Timing``).
    public init(columns: Int, rows: Int, pinMap: PCF8574PinMap = .common, timing: HD44780Emulator.Timing? = nil) {
        let lcd = HD44780Emulator(columns: columns, rows: rows, timing: timing)
        self.lcd = lcd
        self.pinMap = pinMap
        let wiring = Wiring(pinMap: pinMap)
        expander = PCF8574(onPortWrite: { port in wiring.drive(lcd, from: port) })
        expander.powerOn()
    }

    /// Whether the backlight transistor's input is high (lit on the usual
    /// backpacks).
    public var backlight: Bool {
        Wiring(pinMap: pinMap).isHigh(pinMap.backlight, in: expander.port)
    }

    /// Unplug and plug back: both chips return to their power-on state.
    public func powerCycle() {
        lcd.reset()
        expander.powerOn()
    }

    public func receive(_ bytes: [UInt8]) {
        expander.receive(bytes)
    }

    public func transmit(count: Int) -> [UInt8] {
        expander.transmit(count: count)
    }

    /// The traces on the backpack. Reads the bits itself instead of using
    /// the pin map's helpers, so the emulator does not share the driver's
    /// encoding code.
    private struct Wiring: Sendable {
        let pinMap: PCF8574PinMap

        func isHigh(_ bit: Int, in port: UInt8) -> Bool {
            (0...7).contains(bit) && (port >> UInt8(bit)) & 1 == 1
        }

        func drive(_ lcd: HD44780Emulator, from port: UInt8) {
            var data: UInt8 = 0
            if isHigh(pinMap.d4, in: port) { data |= 0x1 }
            if isHigh(pinMap.d5, in: port) { data |= 0x2 }
            if isHigh(pinMap.d6, in: port) { data |= 0x4 }
            if isHigh(pinMap.d7, in: port) { data |= 0x8 }
            lcd.drive(
                rs: isHigh(pinMap.rs, in: port),
                rw: isHigh(pinMap.rw, in: port),
                e: isHigh(pinMap.e, in: port),
                data: data
            )
        }
    }
}
