import Devices
import Hardware

/// Harmless transactions that tell whether a chip answers at an address.
/// They only read, so they may run while blecontrold drives the same bus: the
/// kernel runs each transaction whole, and neither chip changes state on a
/// read.
public enum ChipProbe {
    /// What a probe found.
    public enum Outcome: Sendable, Equatable {
        /// The chip answered; a short description of what it said.
        case answered(String)
        /// Nothing acknowledged the address.
        case absent
        /// The bus failed some other way (timeout, bus error, not supported).
        case failed(String)
    }

    /// Reads the PCA9685's MODE1 register (one register read: a write of the
    /// register pointer, a repeated START and a 1-byte read, datasheet §7.3;
    /// an SMBus read-byte-data on SMBus-only adapters).
    public static func pca9685(on bus: any I2CBus, at address: I2CAddress) -> Outcome {
        do {
            let reply = try bus.writeRead([PCA9685.Register.mode1.rawValue], count: 1, at: address)
            guard let byte = reply.first else { return .failed("MODE1 read returned no data") }
            let mode = PCA9685.Mode1(rawValue: byte)
            let state = mode.contains(.sleep) ? "asleep, outputs stopped" : "awake, oscillator running"
            return .answered("MODE1 \(hex(byte)) (\(state))")
        } catch let error as I2CError {
            return error.kind == .noAcknowledge ? .absent : .failed(error.description)
        } catch {
            return .failed("\(error)")
        }
    }

    /// Reads one byte from a PCF8574: the levels of its port pins (NXP
    /// PCF8574 data sheet Rev. 5, "Reading from a port (Input mode)"); an
    /// SMBus receive-byte on SMBus-only adapters. A read does not change the
    /// latch that drives the LCD's pins.
    public static func pcf8574(on bus: any I2CBus, at address: I2CAddress) -> Outcome {
        do {
            let reply = try bus.transfer([.read(count: 1)], at: address)
            guard let byte = reply.first?.first else { return .failed("the read returned no data") }
            return .answered("port \(hex(byte))")
        } catch let error as I2CError {
            return error.kind == .noAcknowledge ? .absent : .failed(error.description)
        } catch {
            return .failed("\(error)")
        }
    }

    /// The same backpack with the other expander: PCF8574 answers at
    /// 0x20…0x27, PCF8574A at 0x38…0x3F with the same A2…A0 jumpers, so a
    /// backpack found at the twin address needs `lcd.address` changed.
    public static func pcf8574Twin(of address: I2CAddress) -> I2CAddress? {
        switch address.rawValue {
        case 0x20...0x27, 0x38...0x3F: return I2CAddress(Int(address.rawValue ^ 0x18))
        default: return nil
        }
    }

    static func hex(_ byte: UInt8) -> String {
        let digits = String(byte, radix: 16)
        return "0x" + (digits.count < 2 ? "0" + digits : digits)
    }
}
