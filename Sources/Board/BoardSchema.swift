import Devices
import Hardware
import Reactor

/// The board-file schema: which keys exist, their defaults and limits.
/// `board/simulator.yaml` is the annotated reference of this schema.
extension BoardReader {
    func board(_ root: Node) -> BoardConfiguration? {
        guard let top = mapping(root, "", allowed: [
            "name", "buses", "servo", "lcd", "led", "switches", "ble", "transports", "control", "protocol", "failsafe", "realtime",
        ]) else { return nil }
        let name = string(top, "name", required: true) ?? "?"
        let buses = top.entries["buses"].map(busList) ?? [:]
        if top.entries["buses"] == nil { fail(root, "buses", "is required (at least one I2C bus)") }

        let servo = top.entries["servo"].flatMap { servoController($0, buses: buses) }
        let lcd = top.entries["lcd"].flatMap { display($0, buses: buses) }
        if let servo, let lcd, servo.chips.contains(where: { $0.bus == lcd.bus && $0.address == lcd.address }) {
            fail(top.entries["lcd"], "lcd.address", "\(lcd.address) is already a PCA9685's address on bus \(lcd.bus)")
        }
        let led = top.entries["led"].flatMap { gpioOutput($0, field: "led", activeLow: false) }
        if case .gpio(let chip, let line, let lineName, _)? = led, case .gpio(let oeChip, let oeLine, let oeName, _)? = servo?.outputEnable,
           Self.lineKey(chip, line, lineName) == Self.lineKey(oeChip, oeLine, oeName) {
            fail(top.entries["led"], "led", "\(Self.lineKey(chip, line, lineName)) is servo.output_enable's line")
        }
        let switches = top.entries["switches"].map { switchList($0, servo: servo, led: led) } ?? []
        let ble = bluetooth(top.entries["ble"])
        let transports = top.entries["transports"].flatMap { mapping($0, "transports", allowed: ["tcp", "serial", "mqtt"]) }
        let tcp = tcpTransport(transports)
        let serial = serialTransport(transports)
        let mqtt = mqttTransport(transports)
        var controlSocket = "/run/blecontrol/control.sock"
        if let node = top.entries["control"], let fields = mapping(node, "control", allowed: ["socket"]) {
            controlSocket = string(fields, "socket", default: controlSocket) ?? controlSocket
            // `private`: a directory only the user running the daemon can
            // write, which is where `blecontrol` looks by default too; a
            // fixed path in /tmp is a name any local user could take first.
            if controlSocket == "private" { controlSocket = UserRuntime.simulatorSocketPath() }
            if !controlSocket.hasPrefix("/") { fail(fields.entries["socket"], "control.socket", "must be an absolute path or private") }
            if controlSocket.utf8.count > 107 { fail(fields.entries["socket"], "control.socket", "is longer than a Unix socket path may be (107 bytes)") }
        }
        var idleTimeout: Duration? = .milliseconds(500)
        if let node = top.entries["protocol"], let fields = mapping(node, "protocol", allowed: ["idle_timeout_ms"]) {
            idleTimeout = milliseconds(fields, "idle_timeout_ms", max: 60_000, default: 500)
        }
        var silenceTimeout: Duration?
        var stallTimeout = Duration.milliseconds(500)
        var faultTimeout = Duration.milliseconds(1000)
        if let node = top.entries["failsafe"], let fields = mapping(node, "failsafe", allowed: ["silence_timeout_ms", "stall_timeout_ms", "fault_timeout_ms"]) {
            silenceTimeout = milliseconds(fields, "silence_timeout_ms", max: 600_000, default: 0)
            stallTimeout = integer(fields, "stall_timeout_ms", in: 50...60_000, default: 500).map { .milliseconds($0) } ?? stallTimeout
            faultTimeout = integer(fields, "fault_timeout_ms", in: 50...60_000, default: 1000).map { .milliseconds($0) } ?? faultTimeout
        }
        var priority: Int32 = 0
        var lockMemory = false
        if let node = top.entries["realtime"], let fields = mapping(node, "realtime", allowed: ["priority", "lock_memory"]) {
            // SCHED_FIFO priorities are 1…99 on Linux (sched(7)); 0 turns it off.
            priority = Int32(integer(fields, "priority", in: 0...99, default: 0) ?? 0)
            lockMemory = bool(fields, "lock_memory", default: false)
        }
        var configuration = BoardConfiguration(
            name: name, buses: buses, servo: servo, lcd: lcd, led: led, ble: ble, tcp: tcp,
            controlSocketPath: controlSocket, protocolIdleTimeout: idleTimeout, silenceTimeout: silenceTimeout,
            stallTimeout: stallTimeout, faultTimeout: faultTimeout, realtimePriority: priority, lockMemory: lockMemory,
            sourcePath: path
        )
        configuration.switches = switches
        configuration.serial = serial
        configuration.mqtt = mqtt
        return configuration
    }

    private func switchList(_ node: Node, servo: ServoConfiguration?, led: LEDConfiguration?) -> [SwitchConfiguration] {
        guard case .sequence(let items, _) = node else {
            fail(node, "switches", "must be a list of switches")
            return []
        }
        var result: [SwitchConfiguration] = []
        var indexLines: [Int: Int] = [:]
        var usedLines: [String: Int] = [:]
        if case .gpio(let chip, let line, let lineName, _)? = led {
            usedLines[Self.lineKey(chip, line, lineName)] = -1
        }
        if case .gpio(let chip, let line, let lineName, _)? = servo?.outputEnable {
            usedLines[Self.lineKey(chip, line, lineName)] = -2
        }
        let channelOutputs = Set(servo?.channels.map { ChipOutput(chip: $0.chip, output: $0.output) } ?? [])
        for (position, item) in items.enumerated() {
            let field = "switches[\(position)]"
            guard let fields = mapping(item, field, allowed: ["switch", "emulated", "chip", "line", "line_name", "active_low", "output", "safe", "name"]) else { continue }
            // docs/protocol.md: the switch index is one byte.
            let index = integer(fields, "switch", in: 0...255, required: true)
            let safeOn = choice(fields, "safe", ["off": false, "on": true], default: false) ?? false
            let emulated = bool(fields, "emulated", default: false)
            let hasGPIO = fields.entries["line"] != nil || fields.entries["line_name"] != nil
            let hasOutput = fields.entries["output"] != nil
            var output: SwitchConfiguration.Output?
            switch (emulated, hasGPIO, hasOutput) {
            case (true, false, false):
                output = .emulated
            case (false, true, false):
                if fields.entries["line"] != nil, fields.entries["line_name"] != nil {
                    fail(item, field, "needs one of `line: N` or `line_name: NAME`, not both")
                    continue
                }
                let line = integer(fields, "line", in: 0...1023)
                let lineName = string(fields, "line_name")
                guard let chip = gpioChip(fields, byName: fields.entries["line_name"] != nil), line != nil || lineName != nil else { continue }
                let key = Self.lineKey(chip, line, lineName)
                if let previous = usedLines[key] {
                    fail(fields.entries["line"] ?? fields.entries["line_name"], "\(field)", previous == -1 ? "\(key) is the status LED's line" : previous == -2 ? "\(key) is servo.output_enable's line" : "\(key) is already switch \(previous)'s line")
                }
                usedLines[key] = index ?? 0
                output = .gpio(chip: chip, line: line, lineName: lineName, activeLow: bool(fields, "active_low", default: false))
            case (false, false, true):
                guard let servo else {
                    fail(fields.entries["output"], "\(field).output", "a PCA9685 output needs the servo section's chip")
                    continue
                }
                guard let pin = chipOutput(fields, "output", chips: servo.chips.count) else { continue }
                if channelOutputs.contains(pin) {
                    fail(fields.entries["output"], "\(field).output", "output \(pin) already drives a channel")
                }
                if result.contains(where: { $0.output == .pca9685(chip: pin.chip, output: pin.output) }) {
                    fail(fields.entries["output"], "\(field).output", "output \(pin) is already a switch")
                }
                output = .pca9685(chip: pin.chip, output: pin.output)
            default:
                fail(item, field, "needs exactly one of `emulated: true`, a GPIO line (`line_name: GPIO22` or `line: N`, with `chip`), or `output: N` (a PCA9685 output)")
                continue
            }
            if let index {
                if let line = indexLines[index] { fail(fields.entries["switch"], "\(field).switch", "switch \(index) is already defined on line \(line)") }
                indexLines[index] = fields.entries["switch"]?.line ?? item.line
            }
            guard let index, let output else { continue }
            result.append(SwitchConfiguration(index: index, output: output, safeOn: safeOn, name: outputName(fields, "name", field: "\(field).name")))
        }
        return result.sorted { $0.index < $1.index }
    }

    func busList(_ node: Node) -> [String: BusConfiguration] {
        guard case .mapping(let named, _) = node else {
            fail(node, "buses", "must map bus names to bus settings")
            return [:]
        }
        if named.isEmpty { fail(node, "buses", "must name at least one bus") }
        var buses: [String: BusConfiguration] = [:]
        for (key, value) in named {
            guard let name = key.scalarText, !name.isEmpty else {
                fail(key, "buses", "bus names must be plain names")
                continue
            }
            let field = "buses.\(name)"
            guard let fields = mapping(value, field, allowed: ["emulated", "device", "adapter", "max_write_bytes", "byte_time_us"]) else { continue }
            let maxWrite = integer(fields, "max_write_bytes", in: 2...8192)
            let emulated = bool(fields, "emulated", default: false)
            let device = string(fields, "device")
            let adapter = string(fields, "adapter")
            let given = [emulated ? "emulated" : nil, device.map { _ in "device" }, adapter.map { _ in "adapter" }].compactMap { $0 }
            guard given.count == 1 else {
                fail(value, field, given.isEmpty
                     ? "needs `device: /dev/i2c-N` or `adapter: NAME` (or `emulated: true` for the simulator)"
                     : "is exactly one of `emulated: true`, `device: /dev/i2c-N` or `adapter: NAME`, not \(given.joined(separator: " and "))")
                continue
            }
            if !emulated, fields.entries["byte_time_us"] != nil {
                fail(fields.entries["byte_time_us"], "\(field).byte_time_us", "only applies to emulated buses")
            }
            if let path = device {
                if !path.hasPrefix("/dev/") { fail(fields.entries["device"], "\(field).device", "must be a device path such as /dev/i2c-1") }
                buses[name] = BusConfiguration(kind: .device(path: path), maxWriteLength: maxWrite)
            } else if let adapter {
                if adapter.isEmpty || adapter.contains("\n") { fail(fields.entries["adapter"], "\(field).adapter", "must be an adapter's name as `i2cdetect -l` lists it") }
                buses[name] = BusConfiguration(kind: .adapter(name: adapter), maxWriteLength: maxWrite)
            } else {
                // 9 clocks per byte at 100 kHz is 90 µs; 10 ms would be absurd.
                let byteTime = integer(fields, "byte_time_us", in: 0...10_000, default: 0) ?? 0
                buses[name] = BusConfiguration(kind: .emulated, byteTime: .microseconds(byteTime), maxWriteLength: maxWrite)
            }
        }
        return buses
    }

    private func checkBus(_ fields: Fields, _ buses: [String: BusConfiguration]) -> String? {
        let defaultBus = buses.count == 1 ? buses.keys.first : nil
        guard let bus = string(fields, "bus", required: defaultBus == nil, default: defaultBus) else { return nil }
        if buses[bus] == nil, !buses.isEmpty {
            fail(fields.entries["bus"], fields.path("bus"), "no bus named \"\(bus)\" (buses: \(buses.keys.sorted().joined(separator: ", ")))")
            return nil
        }
        return bus
    }

    /// The chip keys: in `servo:` itself for one chip, in each entry of
    /// `servo.chips` for several.
    static let chipKeys = ["bus", "address", "frequency_hz", "oscillator_hz", "output_drive"]

    private func servoController(_ node: Node, buses: [String: BusConfiguration]) -> ServoConfiguration? {
        guard let fields = mapping(node, "servo", allowed: Set(Self.chipKeys + ["chips", "channels", "max_flushes_per_period", "output_enable"])) else { return nil }
        let flushBudget = integer(fields, "max_flushes_per_period", in: 0...100, default: 4)
        let outputEnable = fields.entries["output_enable"].flatMap { gpioOutput($0, field: "servo.output_enable", activeLow: true) }
        var chips: [PCA9685Chip?] = []
        // Where each chip was written, for the line of a problem.
        var chipNodes: [Node] = []
        if let list = fields.entries["chips"] {
            for key in Self.chipKeys where fields.entries[key] != nil {
                fail(fields.entries[key], "servo.\(key)", "goes in each entry of servo.chips when the board lists its chips")
            }
            if case .sequence(let items, _) = list, (1...16).contains(items.count) {
                for (index, item) in items.enumerated() {
                    chipNodes.append(item)
                    guard let chipFields = mapping(item, "servo.chips[\(index)]", allowed: Set(Self.chipKeys)) else { chips.append(nil); continue }
                    chips.append(chip(chipFields, buses: buses))
                }
            } else {
                fail(list, "servo.chips", "must be a list of 1 to 16 chips (bus, address, frequency_hz, oscillator_hz, output_drive)")
            }
        } else {
            chips = [chip(fields, buses: buses)]
            chipNodes = [node]
        }
        var seen: [PCA9685Chip] = []
        for (index, chip) in chips.enumerated() {
            guard let chip else { continue }
            let entry = chipNodes[index]
            if seen.contains(where: { $0.bus == chip.bus && $0.address == chip.address }) {
                fail(entry, "servo.chips[\(index)].address", "\(chip.address) on \(chip.bus) is listed twice")
            }
            // Every PCA9685 answers the LED All Call address 0x70 from power-up
            // until MODE1.ALLCALL is cleared (datasheet §7.1.2): writes meant
            // for a chip at 0x70 would reach the others as well.
            if chips.count > 1, chip.address.rawValue == 0x70 {
                fail(entry, "servo.chips[\(index)].address", "0x70 is the All Call address every PCA9685 answers at power-up; give this chip another address")
            }
            seen.append(chip)
        }
        var channels: [ChannelConfiguration] = []
        if let list = fields.entries["channels"] {
            channels = self.channels(list, chips: chips.count)
        } else {
            fail(node, "servo.channels", "is required: list the channels centrals may drive")
        }
        guard let flushBudget, !chips.isEmpty, chips.allSatisfy({ $0 != nil }) else { return nil }
        let resolved = chips.compactMap { $0 }
        for (index, chip) in resolved.enumerated() where chip.frequency.value > 400 {
            if channels.contains(where: { $0.chip == index && $0.role != .pwm }) {
                let several = fields.entries["chips"] != nil
                fail(several ? chipNodes[index] : fields.entries["frequency_hz"], several ? "servo.chips[\(index)].frequency_hz" : "servo.frequency_hz",
                     "\(BoardReader.show(chip.frequency.value)) Hz is too fast for servo/esc channels (their pulses are up to 2.5 ms; use ≤ 400 Hz)")
            }
        }
        if fields.entries["output_enable"] != nil, outputEnable == nil { return nil }
        return ServoConfiguration(chips: resolved, channels: channels.sorted { $0.channel < $1.channel }, maxFlushesPerPeriod: flushBudget, outputEnable: outputEnable)
    }

    /// One chip's settings from `fields` (the servo section or a chip entry).
    func chip(_ fields: Fields, buses: [String: BusConfiguration]) -> PCA9685Chip? {
        let bus = checkBus(fields, buses)
        let address = address(fields, "address", default: 0x40)
        // The prescaler spans 3…255 (datasheet §7.3.5): 24 Hz…1526 Hz at 25 MHz.
        let frequency = number(fields, "frequency_hz", in: 24...1526, default: 50)
        // §7.3.5 and the board variation issue #3 cites: 23–27 MHz internal,
        // up to 50 MHz on EXTCLK.
        let oscillator = number(fields, "oscillator_hz", in: 20_000_000...50_000_000, default: 25_000_000)
        let totemPole = choice(fields, "output_drive", ["totem-pole": true, "open-drain": false], default: true)
        guard let bus, let address, let frequency, let oscillator, let totemPole else { return nil }
        return PCA9685Chip(bus: bus, address: address, frequency: Hertz(frequency), oscillator: Hertz(oscillator), totemPole: totemPole)
    }

    /// An output of one of `chips` PCA9685s: `N` (the first chip) or
    /// `C:N` (chip C of servo.chips, counted from 0).
    private func chipOutput(_ fields: Fields, _ key: String, chips: Int, default value: ChipOutput? = nil) -> ChipOutput? {
        guard let (node, text) = scalar(fields, key) else { return value }
        let parts = text.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
        let numbers = parts.map { BoardReader.parseInteger($0) }
        let parsed: ChipOutput?
        switch (parts.count, numbers.first ?? nil, numbers.last ?? nil) {
        case (1, let output?, _): parsed = ChipOutput(chip: 0, output: output)
        case (2, let chip?, let output?): parsed = ChipOutput(chip: chip, output: output)
        default: parsed = nil
        }
        guard let parsed else {
            fail(node, fields.path(key), "\"\(text)\" is not an output: N (0…15) on the first chip, or CHIP:N")
            return nil
        }
        guard (0..<max(chips, 1)).contains(parsed.chip) else {
            fail(node, fields.path(key), "chip \(parsed.chip) is not in servo.chips (\(chips) chip\(chips == 1 ? "" : "s"), counted from 0)")
            return nil
        }
        guard (0...15).contains(parsed.output) else {
            fail(node, fields.path(key), "output \(parsed.output) is not one of the PCA9685's 0…15")
            return nil
        }
        return parsed
    }

    private func channels(_ node: Node, chips: Int) -> [ChannelConfiguration] {
        guard case .sequence(let sequence, _) = node else {
            fail(node, "servo.channels", "must be a list of channels")
            return []
        }
        var result: [ChannelConfiguration] = []
        var channelLines: [Int: Int] = [:]
        var outputLines: [ChipOutput: Int] = [:]
        for (index, item) in sequence.enumerated() {
            let field = "servo.channels[\(index)]"
            guard let fields = mapping(item, field, allowed: [
                "channel", "output", "role", "min_us", "center_us", "max_us", "invert",
                "failsafe", "failsafe_us", "failsafe_dwell_ms", "name", "speed_us_per_s", "accel_us_per_s2", "start_us", "release_after_ms",
            ]) else { continue }
            // docs/protocol.md: a channel is one byte.
            let channel = integer(fields, "channel", in: 0...255, required: true)
            let output = chipOutput(fields, "output", chips: chips, default: channel.flatMap { $0 <= 15 ? ChipOutput(chip: 0, output: $0) : nil })
            if fields.entries["output"] == nil, let channel, channel > 15 {
                fail(item, "\(field).output", "is required for channel \(channel) (outputs are 0…15, or CHIP:N)")
            }
            let role = choice(fields, "role", Dictionary(uniqueKeysWithValues: ChannelRole.allCases.map { ($0.rawValue, $0) }), default: .servo)
            // Hobby servos and ESCs are specified for 1000–2000 µs; some
            // travel 500–2500 µs. Beyond that the pulse is not a servo pulse.
            let minimum = number(fields, "min_us", in: 400...2600, default: 1000)
            let maximum = number(fields, "max_us", in: 400...2600, default: 2000)
            var center = number(fields, "center_us", in: 400...2600, default: nil)
            if let minimum, let maximum {
                if minimum >= maximum { fail(fields.entries["min_us"] ?? item, "\(field).min_us", "must be below max_us (\(BoardReader.show(maximum)))") }
                if center == nil { center = (minimum + maximum) / 2 }
                if let center, minimum < maximum, !(minimum...maximum).contains(center) {
                    fail(fields.entries["center_us"], "\(field).center_us", "must lie within min_us…max_us")
                }
            }
            let invert = bool(fields, "invert", default: false)
            let failsafe = failsafeAction(fields, field: field, role: role, range: (minimum ?? 0)...(max(maximum ?? 0, minimum ?? 0)))
            let dwell = integer(fields, "failsafe_dwell_ms", in: 0...10_000, default: 500)
            // Motion limits: a servo's or an ESC's pulse moves at most this
            // fast (µs/s) and speeds up and slows down at most this hard
            // (µs/s²); absent, it jumps as the original board did.
            let speed = number(fields, "speed_us_per_s", in: 1...1_000_000, default: nil)
            let acceleration = number(fields, "accel_us_per_s2", in: 1...100_000_000, default: nil)
            for key in ["speed_us_per_s", "accel_us_per_s2", "start_us"] where role == .pwm && fields.entries[key] != nil {
                fail(fields.entries[key], "\(field).\(key)", "applies to servo and esc channels (a pwm channel has no pulse to move)")
            }
            let start = number(fields, "start_us", in: (minimum ?? 400)...(max(maximum ?? 2600, minimum ?? 400)), default: nil)
            let release = integer(fields, "release_after_ms", in: 1...3_600_000, default: nil)
            if release != nil, role != .servo {
                // An ESC without pulses disarms or beeps; a PWM output has no servo to rest.
                fail(fields.entries["release_after_ms"], "\(field).release_after_ms", "applies to servo channels only")
            }
            if let channel {
                if let line = channelLines[channel] { fail(fields.entries["channel"], "\(field).channel", "channel \(channel) is already defined on line \(line)") }
                channelLines[channel] = fields.entries["channel"]?.line ?? 0
            }
            if let output {
                if let line = outputLines[output] { fail(fields.entries["output"] ?? item, "\(field).output", "output \(output) is already used on line \(line)") }
                outputLines[output] = (fields.entries["output"] ?? item).line
            }
            guard let channel, let output, let role, let minimum, let maximum, let center, let failsafe, let dwell else { continue }
            result.append(ChannelConfiguration(
                channel: channel, output: output.output, role: role,
                minimum: Microseconds(minimum), center: Microseconds(center), maximum: Microseconds(maximum),
                invert: invert, failsafe: failsafe, failsafeDwell: .milliseconds(dwell), chip: output.chip,
                name: outputName(fields, "name", field: "\(field).name"),
                motion: MotionLimits(speed: speed, acceleration: acceleration),
                start: start.map(Microseconds.init), releaseAfter: release.map { .milliseconds($0) }
            ))
        }
        return result
    }

    private func failsafeAction(_ fields: Fields, field: String, role: ChannelRole?, range: ClosedRange<Double>) -> FailsafeAction? {
        // Defaults per role: a servo holds its position; an ESC and a PWM
        // output stop (an ESC cuts the motor when pulses stop).
        let fallback: FailsafeAction = role == .servo ? .hold : .off
        let kind = choice(fields, "failsafe", ["hold": "hold", "off": "off", "pulse": "pulse"], default: fields.entries["failsafe_us"] == nil ? nil : "pulse")
        switch kind {
        case nil:
            return fields.entries["failsafe"] == nil ? fallback : nil
        case "pulse"?:
            guard let width = number(fields, "failsafe_us", in: range, required: true) else { return nil }
            if role == .pwm { fail(fields.entries["failsafe"], "\(field).failsafe", "a pwm channel's failsafe is `off`") }
            return .pulse(Microseconds(width))
        case "hold"?:
            if role == .esc { fail(fields.entries["failsafe"], "\(field).failsafe", "an esc channel must not hold its throttle; use `off` or `pulse`") }
            if fields.entries["failsafe_us"] != nil { fail(fields.entries["failsafe_us"], "\(field).failsafe_us", "only applies with `failsafe: pulse`") }
            return .hold
        default:
            if fields.entries["failsafe_us"] != nil { fail(fields.entries["failsafe_us"], "\(field).failsafe_us", "only applies with `failsafe: pulse`") }
            return .off
        }
    }

    private func display(_ node: Node, buses: [String: BusConfiguration]) -> LCDConfiguration? {
        guard let fields = mapping(node, "lcd", allowed: [
            "bus", "address", "columns", "rows", "pins", "chars_per_transaction", "line_names",
        ]) else { return nil }
        let bus = checkBus(fields, buses)
        // PCF8574 0x20–0x27, PCF8574A 0x38–0x3F; other addresses are allowed
        // for odd backpacks, the address range check is the I2C one.
        let address = address(fields, "address", default: 0x27)
        let columns = choice(fields, "columns", ["8": 8, "16": 16, "20": 20, "24": 24, "40": 40], default: 16)
        let rows = choice(fields, "rows", ["1": 1, "2": 2, "4": 4], default: 2)
        if let columns, let rows, columns * rows > 80 {
            // The HD44780 has 80 bytes of DDRAM (datasheet §"DDRAM").
            fail(node, "lcd", "\(columns)×\(rows) exceeds the HD44780's 80 characters of display RAM")
        }
        var pins = PCF8574PinMap.common
        if let pinNode = fields.entries["pins"], let pinFields = mapping(pinNode, "lcd.pins", allowed: ["rs", "rw", "e", "backlight", "d4", "d5", "d6", "d7"]) {
            func pin(_ key: String, _ value: Int) -> Int { integer(pinFields, key, in: 0...7, default: value) ?? value }
            pins = PCF8574PinMap(rs: pin("rs", pins.rs), rw: pin("rw", pins.rw), e: pin("e", pins.e), backlight: pin("backlight", pins.backlight),
                                 d4: pin("d4", pins.d4), d5: pin("d5", pins.d5), d6: pin("d6", pins.d6), d7: pin("d7", pins.d7))
            do { try pins.validate() } catch let error as PCF8574PinMap.ValidationError { fail(pinNode, "lcd.pins", error.reason) } catch { fail(pinNode, "lcd.pins", "\(error)") }
        }
        let chunk = integer(fields, "chars_per_transaction", in: 1...20, default: 4)
        var lineNames: [String] = []
        if let namesNode = fields.entries["line_names"] {
            if case .sequence(let items, _) = namesNode {
                for (index, item) in items.enumerated() {
                    if let name = outputName(item, field: "lcd.line_names[\(index)]") { lineNames.append(name) }
                }
                if let rows, items.count > rows { fail(namesNode, "lcd.line_names", "names \(items.count) lines; the display has \(rows)") }
            } else {
                fail(namesNode, "lcd.line_names", "must be a list of names, top line first, such as [Speed, Status]")
            }
        }
        guard let bus, let address, let columns, let rows, let chunk else { return nil }
        var lcd = LCDConfiguration(bus: bus, address: address, columns: columns, rows: rows, pins: pins, charsPerTransaction: chunk)
        lcd.lineNames = lineNames
        return lcd
    }

    /// `led` and `servo.output_enable`: one GPIO output line.
    func gpioOutput(_ node: Node, field: String, activeLow defaultActiveLow: Bool) -> LEDConfiguration? {
        guard let fields = mapping(node, field, allowed: ["emulated", "chip", "line", "line_name", "active_low"]) else { return nil }
        if bool(fields, "emulated", default: false) {
            if fields.entries.count > 1 { fail(node, field, "`emulated: true` takes no other settings") }
            return .emulated
        }
        let chip = gpioChip(fields, byName: fields.entries["line_name"] != nil)
        let line = integer(fields, "line", in: 0...1023)
        let lineName = string(fields, "line_name")
        if (fields.entries["line"] == nil) == (fields.entries["line_name"] == nil) {
            fail(node, field, "needs exactly one of `line: N` or `line_name: NAME` (or `emulated: true`)")
            return nil
        }
        let activeLow = bool(fields, "active_low", default: defaultActiveLow)
        guard let chip, line != nil || lineName != nil else { return nil }
        return .gpio(chip: chip, line: line, lineName: lineName, activeLow: activeLow)
    }

    /// A GPIO line as written (`gpiochip0:GPIO22`, `GPIO22` with no chip),
    /// to tell two uses of one line apart.
    private static func lineKey(_ chip: String, _ line: Int?, _ lineName: String?) -> String {
        let which = lineName ?? line.map(String.init) ?? ""
        return chip.isEmpty ? which : "\(chip):\(which)"
    }

    /// A GPIO line's `chip`: a device (`gpiochip0`, `/dev/gpiochip0`) or a
    /// label (`pinctrl-rp1`). Left out, a line given by name is looked for
    /// on every chip (""), one given by offset is on gpiochip0.
    private func gpioChip(_ fields: Fields, byName: Bool) -> String? {
        string(fields, "chip", default: byName ? "" : "gpiochip0")
    }

    private func bluetooth(_ node: Node?) -> BLEConfiguration {
        var ble = BLEConfiguration(enabled: true, name: "BLEControl", adapter: "hci0")
        guard let node, let fields = mapping(node, "ble", allowed: ["enabled", "name", "adapter", "security", "power_on", "allow", "acquire_write", "set_alias", "acknowledged_writes"]) else { return ble }
        ble.enabled = bool(fields, "enabled", default: true)
        if let name = string(fields, "name") {
            // A complete local name must fit the 31-byte advertisement with
            // flags and a 128-bit UUID elsewhere; 29 bytes is the hard cap of
            // one AD structure (Core Spec Vol 3 Part C §11).
            if name.utf8.count > 29 { fail(fields.entries["name"], "ble.name", "is \(name.utf8.count) bytes; at most 29 fit an advertisement") }
            ble.name = name
        }
        if let adapter = string(fields, "adapter") {
            if !adapter.hasPrefix("hci") || Int(adapter.dropFirst(3)) == nil { fail(fields.entries["adapter"], "ble.adapter", "must name an adapter such as hci0") }
            ble.adapter = adapter
        }
        let securities = Dictionary(uniqueKeysWithValues: BLEConfiguration.Security.allCases.map { ($0.rawValue, $0) })
        ble.security = choice(fields, "security", securities, default: .open) ?? .open
        ble.powerOn = bool(fields, "power_on", default: true)
        ble.acquireWrite = bool(fields, "acquire_write", default: false)
        ble.setAlias = bool(fields, "set_alias", default: false)
        ble.acknowledgedWrites = bool(fields, "acknowledged_writes", default: false)
        if ble.acknowledgedWrites, ble.acquireWrite {
            // With write-without-response gone bluetoothd never acquires a
            // write socket; saying both is a contradiction, not a preference.
            fail(fields.entries["acquire_write"], "ble.acquire_write", "cannot be true with acknowledged_writes: true (no write-without-response, nothing to acquire)")
        }
        if let allowNode = fields.entries["allow"] {
            guard case .sequence(let items, _) = allowNode else {
                fail(allowNode, "ble.allow", "must be a list of addresses such as [AA:BB:CC:DD:EE:FF]")
                return ble
            }
            for item in items {
                let text = item.scalarText?.uppercased() ?? ""
                let octets = text.split(separator: ":", omittingEmptySubsequences: false)
                guard octets.count == 6, octets.allSatisfy({ $0.count == 2 && UInt8($0, radix: 16) != nil }) else {
                    fail(item, "ble.allow", "\"\(item.scalarText ?? "")\" is not a Bluetooth address (AA:BB:CC:DD:EE:FF)")
                    continue
                }
                ble.allow.append(text)
            }
        }
        return ble
    }

    private func serialTransport(_ fields: Fields?) -> SerialConfiguration? {
        guard let serialNode = fields?.entries["serial"],
              let serial = mapping(serialNode, "transports.serial", allowed: ["enabled", "device", "baud", "at_setup", "name"]) else { return nil }
        guard bool(serial, "enabled", default: true) else { return nil }
        guard let device = string(serial, "device", required: true) else { return nil }
        if !device.hasPrefix("/dev/") { fail(serial.entries["device"], "transports.serial.device", "must be a device path such as /dev/serial0 or /dev/ttyUSB0") }
        // The rates an HM-10 can be set to (AT+BAUD0…8).
        let rates = [1200, 2400, 4800, 9600, 19200, 38400, 57600, 115_200, 230_400]
        let baud = choice(serial, "baud", Dictionary(uniqueKeysWithValues: rates.map { (String($0), $0) }), default: 9600)
        let name = string(serial, "name")
        // The HM-10 takes names of up to 12 characters (AT+NAME), printable ASCII.
        if let name, name.count > 12 || !name.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) }) {
            fail(serial.entries["name"], "transports.serial.name", "\"\(name)\" is not an HM-10 name: 1 to 12 printable ASCII characters, no spaces")
        }
        guard let baud else { return nil }
        return SerialConfiguration(device: device, baud: baud, atSetup: bool(serial, "at_setup", default: true), name: name)
    }

    private func tcpTransport(_ fields: Fields?) -> TCPConfiguration? {
        guard let tcpNode = fields?.entries["tcp"],
              let tcp = mapping(tcpNode, "transports.tcp", allowed: ["enabled", "listen", "allow_network", "max_connections"]) else { return nil }
        guard bool(tcp, "enabled", default: true) else { return nil }
        guard let listen = string(tcp, "listen", default: "127.0.0.1:7171") else { return nil }
        guard var endpoint = TCPConfiguration(endpoint: listen) else {
            fail(tcp.entries["listen"], "transports.tcp.listen", "\"\(listen)\" is not HOST:PORT (e.g. 127.0.0.1:7171 or [::1]:7171)")
            return nil
        }
        // Anything that connects can drive the outputs, and the unit no
        // longer filters addresses (an MQTT broker may be anywhere): the
        // daemon itself keeps the listener off the network unless the board
        // file says so in as many words.
        if !endpoint.isLoopback, !bool(tcp, "allow_network", default: false) {
            fail(tcp.entries["listen"], "transports.tcp.listen",
                 "\"\(listen)\" is not a loopback address (127.x.x.x, [::1] or localhost): anything that connects can drive the outputs; add allow_network: true to listen there")
        }
        // Each connection costs a descriptor and ~6 KB; the unit's
        // LimitNOFILE= leaves room for 4096.
        endpoint.maxConnections = integer(tcp, "max_connections", in: 1...4000, default: 64) ?? 64
        return endpoint
    }
}

extension BoardReader {
    fileprivate func mqttTransport(_ fields: Fields?) -> MQTTConfiguration? {
        guard let node = fields?.entries["mqtt"], let mqtt = mapping(node, "transports.mqtt", allowed: [
            "enabled", "broker", "client_id", "topic_prefix", "keepalive_s", "username", "password_file",
            "ca_file", "cert_file", "key_file", "status_interval_ms", "discovery", "discovery_prefix", "configuration_url",
        ]) else { return nil }
        guard bool(mqtt, "enabled", default: true) else { return nil }
        var configuration = MQTTConfiguration(host: "", port: 1883)
        let tls = string(mqtt, "ca_file") != nil
        guard let broker = string(mqtt, "broker", required: true) else { return nil }
        if let endpoint = MQTTConfiguration.broker(broker, tls: tls) {
            (configuration.host, configuration.port) = endpoint
        } else {
            fail(mqtt.entries["broker"], "transports.mqtt.broker", "\"\(broker)\" is not HOST or HOST:PORT (e.g. mqtt.local or 192.168.1.2:1883)")
            return nil
        }
        func path(_ key: String) -> String? {
            guard let value = string(mqtt, key) else { return nil }
            if !value.hasPrefix("/") { fail(mqtt.entries[key], "transports.mqtt.\(key)", "must be an absolute path") }
            return value
        }
        configuration.clientID = string(mqtt, "client_id")
        if let id = configuration.clientID, id.isEmpty || id.utf8.count > 23 * 8 {
            fail(mqtt.entries["client_id"], "transports.mqtt.client_id", "must be 1 to 184 bytes")
        }
        if let prefix = string(mqtt, "topic_prefix", default: "blecontrol") {
            if !MQTTConfiguration.isTopicLevel(prefix, allowSlash: true) {
                fail(mqtt.entries["topic_prefix"], "transports.mqtt.topic_prefix", "\"\(prefix)\" is not a topic prefix (no +, #, empty levels or leading /)")
            }
            configuration.topicPrefix = prefix
        }
        // MQTT's keepalive is a 16-bit count of seconds; libmosquitto wants 5 or more.
        configuration.keepalive = integer(mqtt, "keepalive_s", in: 5...65_535, default: 15) ?? 15
        configuration.username = string(mqtt, "username")
        configuration.passwordFile = path("password_file")
        if configuration.passwordFile != nil, configuration.username == nil {
            fail(mqtt.entries["password_file"], "transports.mqtt.password_file", "needs transports.mqtt.username")
        }
        configuration.caFile = path("ca_file")
        configuration.certFile = path("cert_file")
        configuration.keyFile = path("key_file")
        if (configuration.certFile == nil) != (configuration.keyFile == nil) {
            fail(mqtt.entries["cert_file"] ?? mqtt.entries["key_file"], "transports.mqtt.cert_file", "and key_file go together")
        }
        if configuration.certFile != nil, configuration.caFile == nil {
            fail(mqtt.entries["cert_file"], "transports.mqtt.cert_file", "needs transports.mqtt.ca_file (a client certificate is TLS)")
        }
        configuration.statusInterval = .milliseconds(integer(mqtt, "status_interval_ms", in: 100...3_600_000, default: 1000) ?? 1000)
        configuration.discovery = bool(mqtt, "discovery", default: true)
        if let prefix = string(mqtt, "discovery_prefix", default: "homeassistant") {
            if !MQTTConfiguration.isTopicLevel(prefix, allowSlash: true) {
                fail(mqtt.entries["discovery_prefix"], "transports.mqtt.discovery_prefix", "\"\(prefix)\" is not a topic prefix (no +, #, empty levels or leading /)")
            }
            configuration.discoveryPrefix = prefix
        }
        if let url = string(mqtt, "configuration_url") {
            // Home Assistant accepts only these (its device registry's rule).
            let scheme = url.split(separator: ":", maxSplits: 1).first.map(String.init) ?? ""
            if !["http", "https", "homeassistant"].contains(scheme) || !url.contains(":") || url.contains(where: { $0.isWhitespace }) {
                fail(mqtt.entries["configuration_url"], "transports.mqtt.configuration_url", "\"\(url)\" is not an http:// or https:// URL")
            }
            configuration.configurationURL = url
        }
        return configuration
    }
}

extension TCPConfiguration {
    /// Parses `HOST:PORT`: an IPv4 address, `[IPv6]` or a host name, and a
    /// port 0…65535 (0 lets the kernel pick one).
    public init?(endpoint: String) {
        guard let colon = endpoint.lastIndex(of: ":") else { return nil }
        var host = String(endpoint[..<colon])
        guard let port = UInt16(endpoint[endpoint.index(after: colon)...]) else { return nil }
        if host.hasPrefix("["), host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
        } else if host.contains(":") {
            return nil  // an IPv6 address needs brackets to separate the port
        }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "[" || $0 == "]" || $0 == "/" }) else { return nil }
        self.init(host: host, port: port)
    }
}

/// A PCA9685 output of the board: which chip of `servo.chips`, which pin.
struct ChipOutput: Hashable, CustomStringConvertible {
    var chip: Int
    var output: Int
    var description: String { chip == 0 ? "\(output)" : "\(chip):\(output)" }
}

extension BoardReader {
    /// A name for an output (`name:` of a channel or switch, an entry of
    /// `lcd.line_names`), fit by ``OutputName``'s rule.
    fileprivate func outputName(_ fields: Fields, _ key: String, field: String) -> String? {
        guard let node = fields.entries[key] else { return nil }
        return outputName(node, field: field)
    }

    fileprivate func outputName(_ node: Node, field: String) -> String? {
        guard let text = node.scalarText else {
            fail(node, field, "must be a name such as steering")
            return nil
        }
        let name = text.trimmed
        if let fault = OutputName.fault(name) {
            fail(node, field, fault)
            return nil
        }
        return name
    }
}
