import Board
import DeviceEmulators
import Devices
import Firmware
import Hardware
import LinuxHardware
import Logging
import Reactor

/// The emulated chips of a simulator board, attached to its emulated buses
/// when the buses are opened: the simulator is a board whose buses carry
/// emulators, and nothing above this file knows the difference.
public struct BoardEmulators: @unchecked Sendable {
    // The emulators are thread-safe themselves; this is a bag of references.
    public var buses: [String: EmulatedI2CBus] = [:]
    /// The emulated PCA9685s, in servo.chips order (the chips on emulated
    /// buses; a simulator board has all of them there).
    public var pca9685: [PCA9685Emulator] = []
    /// servo.chips index → position in ``pca9685``.
    var pca9685ByChip: [Int: Int] = [:]
    public var lcd: LCDBackpackEmulator?
    public var led: EmulatedDigitalOutput?
    /// Emulated switch lines by switch index.
    public var switches: [Int: EmulatedDigitalOutput] = [:]
    /// The emulated line on the chips' OE pin (`servo.output_enable`).
    public var outputEnable: EmulatedDigitalOutput?

    public var isEmpty: Bool { buses.isEmpty && led == nil && switches.isEmpty && outputEnable == nil }
}

/// What a status report reads back from the hardware: on a simulator board
/// what the emulated chips decoded from the bus traffic, so status checks
/// the drivers rather than the daemon's intentions; on real hardware
/// nothing (status then shows what was written).
protocol OutputObserver: Sendable {
    func output(chip: Int, output: Int) -> (pulse: Double, duty: Double)?
    func displayLines() -> [String]?
    func ledLit() -> Bool?
}

struct EmulatorObserver: OutputObserver {
    let emulators: BoardEmulators

    func output(chip: Int, output: Int) -> (pulse: Double, duty: Double)? {
        guard let position = emulators.pca9685ByChip[chip] else { return nil }
        let produced = emulators.pca9685[position].output(channel: output)
        return (produced.pulseWidth.value, produced.duty)
    }

    func displayLines() -> [String]? { emulators.lcd.map { $0.lcd.lines } }
    func ledLit() -> Bool? { emulators.led?.isActive }
}

/// Opens the I2C buses a board file names: one place for the emulated and
/// the Linux backends, used by the daemon and by `safe-outputs`. An
/// emulated bus comes with the board's chips on it.
public enum BoardBuses {
    public struct SetupError: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// The buses by name, and the emulators attached to the emulated ones.
    public static func open(_ configuration: BoardConfiguration, logger: Logger) throws -> (buses: [String: any I2CBus], emulators: BoardEmulators) {
        var buses: [String: any I2CBus] = [:]
        var emulators = BoardEmulators()
        for (name, bus) in configuration.buses.sorted(by: { $0.key < $1.key }) {
            switch bus.kind {
            case .emulated:
                let emulated = EmulatedI2CBus(maxWriteLength: bus.maxWriteLength, byteTime: bus.byteTime)
                emulators.buses[name] = emulated
                buses[name] = emulated
            case .device, .adapter:
                do {
                    // On an SMBus-only adapter the PCF8574's port bytes go out
                    // as I2C block writes: the "command" byte is just the
                    // first port byte on the wire, and the PCF8574 latches
                    // every byte it receives (NXP PCF8574 datasheet §8.2), so
                    // a 33-byte block equals a plain write (the HD44780 driver
                    // keeps writes within maxWriteLength): 4 transfers per
                    // LCD line instead of 68 send-bytes.
                    if let path = try bus.kind.devicePath() { buses[name] = try LinuxI2CBus(path: path, logger: logger) }
                } catch {
                    throw SetupError(description: "bus \(name): \(error)")
                }
            }
        }
        for (index, chip) in (configuration.servo?.chips ?? []).enumerated() {
            guard let emulated = emulators.buses[chip.bus] else { continue }
            let emulator = PCA9685Emulator(oscillator: chip.oscillator)
            emulated.attach(emulator, at: chip.address)
            emulators.pca9685ByChip[index] = emulators.pca9685.count
            emulators.pca9685.append(emulator)
        }
        if let lcd = configuration.lcd, let emulated = emulators.buses[lcd.bus] {
            let display = LCDBackpackEmulator(columns: lcd.columns, rows: lcd.rows, pinMap: lcd.pins)
            emulated.attach(display, at: lcd.address)
            emulators.lcd = display
        }
        return (buses, emulators)
    }

    /// Switches every PCA9685 output off with one write per chip, without
    /// starting or sleeping the chip, and the output-enable line to
    /// disabled: what `blecontrold safe-outputs` does after a crash
    /// (systemd's ExecStopPost=) and at boot. It is the one thing that
    /// touches the chips without the instance lock, on purpose: it runs
    /// when the daemon that held the lock is gone (or hung), and an all-off
    /// write is safe whatever state the chip is in. Returns what it did.
    ///
    /// `waitingUpTo`: at boot the bus's device node appears only once udev
    /// has loaded the adapter's driver and i2c-dev, which can come after
    /// this runs: wait for the chips' bus devices this long (nothing is
    /// written until they exist; a bus that never comes is the error).
    public static func safeOutputs(_ outputs: DrivenOutputs, waitingUpTo wait: Duration = .zero, logger: Logger) throws -> String {
        if outputs.chips.isEmpty, outputs.outputEnable == nil { return "no PCA9685 on a real bus: nothing outlives the daemon, nothing to switch off" }
        let deadline = ContinuousClock.now + wait
        while !outputs.chips.allSatisfy(\.bus.isPresent), ContinuousClock.now < deadline {
            sleepThread(.milliseconds(20))
        }
        // Every chip gets its write even when one fails: one dead chip must
        // not leave another one's ESC running.
        var done: [String] = []
        var failed: [String] = []
        var opened: [String: LinuxI2CBus] = [:]
        for chip in outputs.chips {
            do {
                guard let path = try chip.bus.devicePath() else { continue }
                let bus = try opened[path] ?? LinuxI2CBus(path: path, logger: logger)
                opened[path] = bus
                let driver = PCA9685(bus: bus, configuration: PCA9685.Configuration(address: chip.address), logger: logger)
                try driver.allOff()
                done.append("\(chip): every output off")
            } catch {
                failed.append("\(chip): \(error)")
            }
        }
        if case .gpio(let chip, let offset, let lineName, let activeLow)? = outputs.outputEnable {
            // Requested inactive: the PCA9685's /OE disables every output
            // (datasheet §7.4), whatever its registers hold.
            do {
                let line = try GPIODLine(chip: chip, offset: offset, lineName: lineName, activeLow: activeLow, consumer: "blecontrold safe-outputs")
                try line.set(false)
                done.append("output enable \(line.label): outputs disabled")
            } catch {
                failed.append("servo.output_enable: \(error)")
            }
        }
        guard failed.isEmpty else {
            throw SetupError(description: (failed + done).joined(separator: "; "))
        }
        return done.joined(separator: "\n")
    }
}

/// Everything a board file describes, built and wired but not started:
/// buses (behind their arbiters), the servo path, the LCD service, the
/// status LED, the switches, and what status reads back. Nothing touches a
/// bus yet. The one place a board is put together: the daemon
/// (``BoardRuntime``), the tests, the session fuzzer and the benchmarks
/// all build theirs here, on emulated buses where the board file says so.
public struct BoardAssembly {
    public let configuration: BoardConfiguration
    /// The emulated buses' chips, display and lines (empty on real hardware).
    public let emulators: BoardEmulators
    let observer: (any OutputObserver)?
    public let servo: ServoPath?
    /// The arbiters of the buses the PCA9685s are on.
    public let servoArbiters: [BusArbiter]
    /// Each chip's frequency as programmed (prescale rounding, §7.3.5).
    public let servoFrequencies: [Hertz]
    public let lcd: LCDService?
    public let led: StatusLED?
    public let switches: SwitchBank?

    /// - Parameters:
    ///   - watchdogInterval: systemd's; the servo thread beats at half of it
    ///     (nil: an idle servo thread sleeps until there is work).
    ///   - retryInterval: how soon a PCA9685 or a display that did not
    ///     answer is tried again (tests shorten it).
    ///   - sleep: how the drivers wait out the datasheets' times (the
    ///     PCA9685's oscillator, the HD44780's instructions); the session
    ///     fuzzer skips them.
    public init(configuration: BoardConfiguration, watchdogInterval: Duration? = nil, retryInterval: Duration = .seconds(1),
                sleep: @escaping @Sendable (Duration) -> Void = threadSleep, logger: Logger) throws {
        self.configuration = configuration
        let (buses, attached) = try BoardBuses.open(configuration, logger: logger)
        var emulators = attached
        var arbiters: [String: BusArbiter] = [:]
        for (name, bus) in buses { arbiters[name] = BusArbiter(bus: bus) }

        if let servoConfiguration = configuration.servo {
            // One driver per chip, each on its bus's arbiter: a flush writes
            // each touched chip in its own transactions.
            var drivers: [PCA9685] = []
            for chip in servoConfiguration.chips {
                guard let arbiter = arbiters[chip.bus] else { throw BoardBuses.SetupError(description: "\(chip): no bus \(chip.bus)") }
                drivers.append(PCA9685(bus: arbiter.client(.servo), configuration: PCA9685.Configuration(chip), logger: logger, sleep: sleep))
            }
            servoFrequencies = drivers.map(\.actualFrequency)
            var timing = ServoPath.Timing()
            // Flushes are paced to the fastest chip's period: a slower chip
            // just shows the newest value from its own next period.
            let fastest = servoFrequencies.map(\.value).max() ?? 50
            timing.period = .microseconds(Int64(1_000_000 / fastest))
            timing.retryInterval = retryInterval
            timing.faultFailsafeAfter = configuration.faultTimeout
            timing.maxFlushesPerPeriod = servoConfiguration.maxFlushesPerPeriod
            // The watchdog is fed from the servo thread, so a stalled servo
            // thread is what the watchdog catches; without one, an idle
            // servo thread sleeps until there is work.
            timing.heartbeat = watchdogInterval.map { $0 / 2 }
            let outputEnable = try servoConfiguration.outputEnable.map { line in
                try Self.output(line, "servo.output_enable") { emulators.outputEnable = EmulatedDigitalOutput(name: "output-enable"); return emulators.outputEnable! }
            }
            servo = ServoPath(
                drivers: drivers, channels: servoConfiguration.channels, timing: timing,
                realtime: configuration.realtimePriority > 0 || configuration.lockMemory
                    ? ServoPath.Realtime(priority: configuration.realtimePriority, lockedMemory: configuration.lockMemory) : nil,
                outputEnable: outputEnable, logger: logger
            )
            var seen = Set<String>()
            servoArbiters = servoConfiguration.chips.compactMap { chip in seen.insert(chip.bus).inserted ? arbiters[chip.bus] : nil }
        } else {
            servoFrequencies = []
            servo = nil
            servoArbiters = []
        }

        if let lcdConfiguration = configuration.lcd, let arbiter = arbiters[lcdConfiguration.bus] {
            let geometry = LCDGeometry(columns: lcdConfiguration.columns, rows: lcdConfiguration.rows)
            let driver = HD44780(
                interface: PCF8574Interface(bus: arbiter.client(.display), backpack: PCF8574Backpack(address: lcdConfiguration.address, pinMap: lcdConfiguration.pins)),
                geometry: geometry, charactersPerTransaction: lcdConfiguration.charsPerTransaction, logger: logger, sleep: sleep
            )
            lcd = LCDService(driver: driver, geometry: geometry, probeInterval: retryInterval, logger: logger)
        } else {
            lcd = nil
        }

        led = try configuration.led.map { line in
            StatusLED(output: try Self.output(line, "led") { emulators.led = EmulatedDigitalOutput(); return emulators.led! }, logger: logger)
        }

        var switchDrivers: [(SwitchConfiguration, SwitchBank.Driver)] = []
        for item in configuration.switches {
            switch item.output {
            case .emulated:
                let line = EmulatedDigitalOutput(name: "switch\(item.index)")
                emulators.switches[item.index] = line
                switchDrivers.append((item, .line(line)))
            case .gpio(let chip, let line, let lineName, let activeLow):
                do {
                    switchDrivers.append((item, .line(try GPIODLine(chip: chip, offset: line, lineName: lineName, activeLow: activeLow))))
                } catch {
                    throw BoardBuses.SetupError(description: "switch \(item.index): \(error)")
                }
            case .pca9685(let chip, let output):
                guard let servo else { throw BoardBuses.SetupError(description: "switch \(item.index): no PCA9685 on this board") }
                switchDrivers.append((item, .chip(servo, chip: chip, output: output)))
            }
        }
        switches = switchDrivers.isEmpty ? nil : SwitchBank(switchDrivers, logger: logger)
        self.emulators = emulators
        observer = emulators.isEmpty ? nil : EmulatorObserver(emulators: emulators)
    }

    /// The dispatcher over these parts: where every central's frames go.
    public func dispatcher(logger: Logger) -> Dispatcher {
        Dispatcher(servo: servo, lcd: lcd, switches: switches, logger: logger)
    }

    /// A board file's output line, opened: `emulated` makes (and keeps)
    /// the simulator's; a GPIO line that cannot be had names `what`.
    private static func output(_ line: LEDConfiguration, _ what: String, emulated: () -> EmulatedDigitalOutput) throws -> any DigitalOutput {
        switch line {
        case .emulated:
            return emulated()
        case .gpio(let chip, let offset, let lineName, let activeLow):
            do {
                return try GPIODLine(chip: chip, offset: offset, lineName: lineName, activeLow: activeLow)
            } catch {
                throw BoardBuses.SetupError(description: "\(what): \(error)")
            }
        }
    }
}
