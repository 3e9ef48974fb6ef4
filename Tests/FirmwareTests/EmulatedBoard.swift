import BLEControlProtocol
import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
@testable import Firmware
import Board
import Control
import Reactor
import TestSupport

/// The firmware core on an emulated bus, without transports: frames go in
/// through a `Session`, outputs are read back from the emulated chips.
final class EmulatedBoard: @unchecked Sendable {
    let bus: EmulatedI2CBus
    let chip = PCA9685Emulator()
    let display: LCDBackpackEmulator
    let servo: ServoPath
    let lcd: LCDService
    let dispatcher: Dispatcher
    let configuration: BoardConfiguration
    private let lock = NSLock()
    private var sent: [UInt8] = []

    /// `byteTime`: how long each byte holds the emulated bus (90 µs is a
    /// 100 kHz bus), for tests where the display must be slow.
    init(yaml: String? = nil, attachDisplay: Bool = true, retryInterval: Duration = .milliseconds(50), byteTime: Duration = .zero) throws {
        bus = EmulatedI2CBus(byteTime: byteTime)
        configuration = try BoardFile.parse(yaml ?? escBoard, path: "test.yaml")
        let servoConfiguration = configuration.servo!
        let lcdConfiguration = configuration.lcd!
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let arbiter = BusArbiter(bus: bus)
        bus.attach(chip, at: servoConfiguration.chips[0].address)
        display = LCDBackpackEmulator(columns: lcdConfiguration.columns, rows: lcdConfiguration.rows, pinMap: lcdConfiguration.pins)
        if attachDisplay { bus.attach(display, at: lcdConfiguration.address) }
        let driver = PCA9685(
            bus: arbiter.client(.servo),
            configuration: PCA9685.Configuration(servoConfiguration.chips[0]),
            logger: logger
        )
        servo = ServoPath(driver: driver, channels: servoConfiguration.channels, retryInterval: retryInterval, logger: logger)
        let geometry = LCDGeometry(columns: lcdConfiguration.columns, rows: lcdConfiguration.rows)
        let hd44780 = HD44780(bus: arbiter.client(.display), backpack: PCF8574Backpack(address: lcdConfiguration.address, pinMap: lcdConfiguration.pins), geometry: geometry, charactersPerTransaction: lcdConfiguration.charsPerTransaction, logger: logger)
        lcd = LCDService(driver: hd44780, geometry: geometry, probeInterval: retryInterval, logger: logger)
        dispatcher = Dispatcher(servo: servo, lcd: lcd, logger: logger)
        servo.start()
        lcd.start()
    }

    deinit {
        lcd.stop()
        servo.stop()
    }

    /// A hub of sessions over this board's dispatcher, on `loop` (virtual
    /// time), logging nothing.
    func hub(on loop: ManualLoop, idleTimeout: Duration?) -> SessionHub {
        var logger = Logger(label: "t")
        logger.logLevel = .critical
        return SessionHub(loop: loop, dispatcher: dispatcher, idleTimeout: idleTimeout, logger: logger)
    }

    /// A session like a transport's; replies are collected in `replies`.
    func session(idleTimeout: Duration? = .milliseconds(500)) -> Session {
        Session(id: 1, transport: .tcp, peer: "test", dispatcher: dispatcher, idleTimeout: idleTimeout) { [self] frame in
            lock.withLock { sent += frame }
        }
    }

    /// Everything sent back so far, then forgotten.
    func takeReplies() -> [UInt8] {
        lock.withLock {
            defer { sent.removeAll() }
            return sent
        }
    }

    /// Waits (as `eventually` does) until everything dispatched has reached
    /// the emulated chips; the error that kept it from them, if any.
    @discardableResult
    func settle() -> String? {
        // nil until applied, then the outcome (nil: no error).
        let outcome = LockedBox<String??>(nil)
        dispatcher.whenApplied { error in outcome.value = .some(error) }
        return eventuallyValue { outcome.value } ?? "never applied"
    }

    func pulse(_ output: Int) -> Double { chip.output(channel: output).pulseWidth.value }
    var lines: [String] { display.lcd.lines }
}

final class LockedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}

/// One PCA9685 step at 50 Hz (datasheet §7.3.5: prescale 121 at 25 MHz).
let pulseStep = 4.9
