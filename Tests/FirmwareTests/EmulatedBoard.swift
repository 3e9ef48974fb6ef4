import BLEControlProtocol
import DeviceEmulators
import Devices
import Foundation
import Hardware
import Logging
@testable import Firmware
@testable import Runtime
import Board
import Control
import Reactor
import TestSupport

/// The firmware core on an emulated bus, without transports: frames go in
/// through a `Session`, outputs are read back from the emulated chips. The
/// board is the daemon's own assembly (``BoardAssembly``) of a board file
/// whose bus is emulated.
final class EmulatedBoard: @unchecked Sendable {
    let bus: EmulatedI2CBus
    let chip: PCA9685Emulator
    let display: LCDBackpackEmulator
    let servo: ServoPath
    let lcd: LCDService
    let dispatcher: Dispatcher
    let configuration: BoardConfiguration
    private let lock = NSLock()
    private var sent: [UInt8] = []

    /// `byteTime`: how long each byte holds the emulated bus (90 µs is a
    /// 100 kHz bus), for tests where the display must be slow.
    /// `retryInterval`: how soon a chip or display that did not answer is
    /// tried again; a chip failing for twice that puts the outputs in failsafe.
    init(yaml: String? = nil, attachDisplay: Bool = true, retryInterval: Duration = .milliseconds(50), byteTime: Duration = .zero) throws {
        var configuration = try BoardFile.parse(yaml ?? escBoard, path: "test.yaml")
        for name in configuration.buses.keys { configuration.buses[name]?.byteTime = byteTime }
        configuration.faultTimeout = retryInterval * 2
        self.configuration = configuration
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let parts = try BoardAssembly(configuration: configuration, retryInterval: retryInterval, logger: logger)
        guard let lcdConfiguration = configuration.lcd, let bus = parts.emulators.buses[lcdConfiguration.bus],
              let chip = parts.emulators.pca9685.first, let display = parts.emulators.lcd, let servo = parts.servo, let lcd = parts.lcd
        else { throw BoardBuses.SetupError(description: "the test board needs an emulated bus with a PCA9685 and an LCD") }
        (self.bus, self.chip, self.display, self.servo, self.lcd) = (bus, chip, display, servo, lcd)
        if !attachDisplay { bus.detach(at: lcdConfiguration.address) }
        dispatcher = parts.dispatcher(logger: logger)
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

/// One PCA9685 step at 50 Hz (datasheet §7.3.5: prescale 121 at 25 MHz).
let pulseStep = 4.9
