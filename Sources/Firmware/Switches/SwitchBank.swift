import Board
import Control
import Hardware
import Logging
import Reactor

/// The board's SWITCH_VAL outputs (docs/protocol.md, "SWITCH_VAL"): each switch
/// index the board file names drives a GPIO line, a PCA9685 output held fully
/// on or off, or (on the simulator) an emulated line. On failsafe every
/// switch goes to its safe state. Loop-confined: frames and the failsafe
/// reach it on the event loop.
public final class SwitchBank: @unchecked Sendable {
    // Loop-confined.
    /// What a switch drives.
    public enum Driver {
        /// A digital line (GPIO or emulated), active when on.
        case line(any DigitalOutput)
        /// A PCA9685 output held fully on or off, through the servo path.
        case chip(ServoPath, chip: Int, output: Int)
    }

    private struct Switch {
        var configuration: SwitchConfiguration
        var driver: Driver
        var on = false
        var error: String?
    }

    private var switches: [Int: Switch] = [:]
    private let logger: Logger

    /// The board file's switches, each with what it drives; all start off.
    public init(_ entries: [(SwitchConfiguration, Driver)], logger: Logger) {
        self.logger = logger
        for (configuration, driver) in entries {
            switches[configuration.index] = Switch(configuration: configuration, driver: driver)
        }
    }

    /// SWITCH_VAL: false when the board has no such switch (ERROR 06).
    public func set(_ index: Int, on: Bool) -> Bool {
        guard switches[index] != nil else { return false }
        apply(index, on: on)
        return true
    }

    /// Every switch to its safe state (off unless the board file says on).
    public func failsafe() {
        for index in switches.keys.sorted() {
            guard let entry = switches[index] else { continue }
            apply(index, on: entry.configuration.safeOn)
        }
    }

    /// A reload that renamed switches (and changed nothing else of them).
    public func rename(_ configurations: [SwitchConfiguration]) {
        for configuration in configurations { switches[configuration.index]?.configuration.name = configuration.name }
    }

    /// For status, in index order.
    public var report: [StatusReport.Switch] {
        switches.keys.sorted().compactMap { index in
            guard let entry = switches[index] else { return nil }
            return StatusReport.Switch(switch: index, on: entry.on, output: "\(entry.configuration.output)", error: entry.error, name: entry.configuration.name)
        }
    }

    private func apply(_ index: Int, on: Bool) {
        guard var entry = switches[index] else { return }
        entry.on = on
        switch entry.driver {
        case .line(let line):
            do {
                try line.set(on)
                if entry.error != nil { logger.info("switch \(index) works again") }
                entry.error = nil
            } catch {
                // A GPIO that fails is reported once and retried on the next
                // SWITCH_VAL; it never takes the board down.
                if entry.error == nil { logger.error("switch \(index): \(error)") }
                entry.error = "\(error)"
            }
        case .chip(let servo, let chip, let output):
            servo.setSwitch(chip: chip, output: output, on: on)
        }
        switches[index] = entry
    }
}
