import Foundation
import Hardware
import TestSupport
import Testing
@testable import Board
import Devices

/// The repository root, for the board files under board/.
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

private func problems(_ yaml: String) -> [BoardFileError.Problem] {
    do {
        _ = try BoardFile.parse(yaml, path: "test.yaml")
        return []
    } catch {
        return error.problems
    }
}

private let minimal = """
name: t
buses:
  main:
    emulated: true
"""

@Suite("Board files")
struct BoardFileTests {
    @Test("board/simulator.yaml follows the original demo app: servos 0-3, PWM 4-7, four switches")
    func simulatorBoard() throws {
        let board = try BoardFile.load(path: repositoryRoot.appendingPathComponent("board/simulator.yaml").path)
        #expect(board.name == "simulator")
        #expect(board.buses["main"] == BusConfiguration(kind: .emulated, byteTime: .microseconds(90), maxWriteLength: nil))
        let servo = try #require(board.servo)
        #expect(servo.chips == [PCA9685Chip(bus: "main", address: I2CAddress(0x40)!, frequency: Hertz(50), oscillator: Hertz(25_000_000), totemPole: true)])
        #expect(servo.channels.map(\.channel) == Array(0...7))
        #expect(servo.channels.prefix(4).allSatisfy { $0.role == .servo })
        #expect(servo.channels.suffix(4).allSatisfy { $0.role == .pwm && $0.failsafe == .off })
        #expect(servo.channels[0].failsafe == .hold)
        #expect(servo.channels[3].failsafe == .pulse(Microseconds(1500)))
        #expect(board.switches.map(\.index) == [0, 1, 2, 3])
        #expect(board.switches.allSatisfy { $0.output == .emulated && !$0.safeOn })
        #expect(board.ble.setAlias && !board.ble.acknowledgedWrites)
        let lcd = try #require(board.lcd)
        #expect(lcd.address == I2CAddress(0x27))
        #expect(lcd.columns == 16 && lcd.rows == 2)
        #expect(lcd.pins == .common)
        #expect(board.led == .emulated)
        #expect(board.tcp == TCPConfiguration(host: "127.0.0.1", port: 7171))
        #expect(board.ble.name == "BLEControl-Sim")
        #expect(board.protocolIdleTimeout == .milliseconds(500))
        #expect(board.silenceTimeout == nil)
    }

    @Test("board/rc-car.yaml: a steering servo and an ESC with its neutral-then-off failsafe")
    func rcCarBoard() throws {
        let board = try BoardFile.load(path: repositoryRoot.appendingPathComponent("board/rc-car.yaml").path)
        let servo = try #require(board.servo)
        #expect(servo.channels.map(\.role) == [.servo, .esc])
        #expect(servo.channels[0].failsafe == .pulse(Microseconds(1500)))
        #expect(servo.channels[1].failsafe == .pulse(Microseconds(1000)))
        #expect(servo.channels[1].failsafeDwell == .milliseconds(500))
        #expect(board.silenceTimeout == .milliseconds(1000))
    }

    @Test("board/hexapod.yaml: 18 servos on two chips, channels mapped as CHIP:OUTPUT")
    func hexapodBoard() throws {
        let board = try BoardFile.load(path: repositoryRoot.appendingPathComponent("board/hexapod.yaml").path)
        let servo = try #require(board.servo)
        #expect(servo.chips.map(\.address) == [I2CAddress(0x40), I2CAddress(0x41)])
        #expect(servo.chips.allSatisfy { $0.bus == "i2c1" && $0.frequency.value == 50 })
        #expect(servo.channels.map(\.channel) == Array(0...17))
        #expect(servo.channels.prefix(9).allSatisfy { $0.chip == 0 } && servo.channels.suffix(9).allSatisfy { $0.chip == 1 })
        #expect(servo.channels.map(\.output) == Array(0...8) + Array(0...8))
        // Every joint ramps and starts at its centre: a gait's moves start and end together.
        #expect(servo.channels.allSatisfy { $0.motion == MotionLimits(speed: 1200, acceleration: 12000) && $0.start?.value == 1500 },
                "\(servo.channels.map { ($0.motion, $0.start) })")
    }

    @Test("Motion limits: speed_us_per_s and accel_us_per_s2 on servo and ESC channels; a PWM channel or a bad number is named")
    func motionLimits() throws {
        /// A board with these channels, one YAML flow mapping each.
        func channels(_ items: String...) -> String {
            minimal + "\nservo:\n  channels:\n" + items.map { "    - \($0)\n" }.joined()
        }
        let parsed = try #require(try BoardFile.parse(channels("{ channel: 0, speed_us_per_s: 500, accel_us_per_s2: 2000 }",
                                                              "{ channel: 1, role: esc, speed_us_per_s: 250 }", "{ channel: 2 }"),
                                                     path: "t.yaml").servo?.channels)
        #expect(parsed.map(\.motion) == [MotionLimits(speed: 500, acceleration: 2000), MotionLimits(speed: 250), MotionLimits()])
        #expect(parsed[2].motion.isUnlimited)
        let refused = problems(channels("{ channel: 4, role: pwm, speed_us_per_s: 100 }", "{ channel: 5, accel_us_per_s2: 0 }"))
        #expect(refused.map(\.field) == ["servo.channels[0].speed_us_per_s", "servo.channels[1].accel_us_per_s2"], "\(refused)")
        #expect(refused.first?.message.contains("servo and esc channels") == true, "\(refused)")
        let startAndRelease = try BoardFile.parse(channels("{ channel: 0, start_us: 1500, release_after_ms: 2000 }",
                                                           "{ channel: 1, role: esc, start_us: 1000 }"), path: "t.yaml").servo?.channels
        #expect(startAndRelease?.map(\.start) == [Microseconds(1500), Microseconds(1000)])
        #expect(startAndRelease?.map(\.releaseAfter) == [.milliseconds(2000), nil])
        let badRelease = problems(channels("{ channel: 1, role: esc, release_after_ms: 100 }", "{ channel: 2, start_us: 2500 }"))
        #expect(badRelease.map(\.field) == ["servo.channels[0].release_after_ms", "servo.channels[1].start_us"], "\(badRelease)")
    }

    @Test("Several PCA9685s: chips listed with their own settings; outputs as CHIP:N; clashes named with their line")
    func severalChips() throws {
        let board = try BoardFile.parse(minimal + """

        servo:
          chips:
            - { address: 0x40 }
            - { address: 0x41, frequency_hz: 60, oscillator_hz: 26000000, output_drive: open-drain }
          channels:
            - { channel: 0, output: 0 }
            - { channel: 200, output: 1:0, role: esc }
            - { channel: 7, output: "1:15" }
        switches:
          - { switch: 0, output: "1:3" }
          - { switch: 1, output: 3 }
        """, path: "t.yaml")
        let servo = try #require(board.servo)
        #expect(servo.chips == [
            PCA9685Chip(bus: "main", address: I2CAddress(0x40)!, frequency: Hertz(50), oscillator: Hertz(25_000_000), totemPole: true),
            PCA9685Chip(bus: "main", address: I2CAddress(0x41)!, frequency: Hertz(60), oscillator: Hertz(26_000_000), totemPole: false),
        ])
        #expect(servo.channels.map { [$0.channel, $0.chip, $0.output] } == [[0, 0, 0], [7, 1, 15], [200, 1, 0]])
        #expect(board.switches.map(\.output) == [.pca9685(chip: 1, output: 3), .pca9685(chip: 0, output: 3)])

        let bad = problems(minimal + """

        servo:
          address: 0x40
          chips:
            - { address: 0x41 }
            - { address: 0x41 }
            - { address: 0x70 }
          channels:
            - { channel: 0, output: "3:0" }
            - { channel: 1, output: "1:16" }
            - { channel: 2, output: "x:1" }
            - { channel: 3, output: "1:4" }
            - { channel: 4, output: "1:4" }
        switches:
          - { switch: 0, output: "1:4" }
        """)
        let found = bad.map { "\($0.line.map(String.init) ?? "-") \($0.field)" }
        #expect(found == [
            "6 servo.address", "9 servo.chips[1].address", "10 servo.chips[2].address",
            "12 servo.channels[0].output", "13 servo.channels[1].output", "14 servo.channels[2].output",
            "16 servo.channels[4].output", "18 switches[0].output",
        ], "\(bad)")
        #expect(bad.contains { $0.message.contains("All Call") })
        #expect(problems(minimal + "\nservo:\n  chips: []\n  channels: []\n").contains { $0.field == "servo.chips" })
    }

    @Test("servo.output_enable: the OE line by name (active low unless said), emulated, or by chip and offset; a line used twice is named")
    func outputEnable() throws {
        let servo = minimal + """

        servo:
          address: 0x40
          output_enable: %@
          channels:
            - { channel: 0, output: 0 }
        """
        func parsed(_ line: String) throws -> LEDConfiguration? {
            try BoardFile.parse(servo.replacingOccurrences(of: "%@", with: line), path: "t.yaml").servo?.outputEnable
        }
        #expect(try parsed("{ line_name: GPIO4 }") == .gpio(chip: "", line: nil, lineName: "GPIO4", activeLow: true))
        #expect(try parsed("{ chip: gpiochip0, line: 4, active_low: false }") == .gpio(chip: "gpiochip0", line: 4, lineName: nil, activeLow: false))
        #expect(try parsed("{ emulated: true }") == .emulated)
        #expect(try BoardFile.parse(minimal + "\nservo:\n  address: 0x40\n  channels:\n    - { channel: 0, output: 0 }\n", path: "t.yaml").servo?.outputEnable == nil)

        let clash = problems(servo.replacingOccurrences(of: "%@", with: "{ line_name: GPIO4 }") + """

        led: { line_name: GPIO4 }
        switches:
          - { switch: 0, line_name: GPIO4 }
        """)
        #expect(clash.map(\.field) == ["led", "switches[0]"], "\(clash)")
        #expect(clash.allSatisfy { $0.message.contains("servo.output_enable's line") })
        #expect(problems(servo.replacingOccurrences(of: "%@", with: "{ line: 4, line_name: GPIO4 }")).map(\.field) == ["servo.output_enable"])
    }

    @Test("transports.serial: the HM-10's device, baud, AT set-up and name; bad values named with their line")
    func serialTransport() throws {
        let board = try BoardFile.parse(minimal + """

        transports:
          serial: { device: /dev/serial0, name: BLEControl }
        """, path: "t.yaml")
        #expect(board.serial == SerialConfiguration(device: "/dev/serial0", baud: 9600, atSetup: true, name: "BLEControl"))
        #expect(board.tcp == nil)
        let off = try BoardFile.parse(minimal + "\ntransports:\n  serial: { enabled: false, device: /dev/ttyUSB0 }\n", path: "t.yaml")
        #expect(off.serial == nil)
        let bad = problems(minimal + """

        transports:
          serial: { device: ttyS0, baud: 9601, name: "far too long a name", parity: even }
        """)
        #expect(bad.map(\.field).sorted() == ["transports.serial.baud", "transports.serial.device", "transports.serial.name", "transports.serial.parity"], "\(bad)")
        #expect(bad.allSatisfy { $0.line == 6 }, "\(bad)")
    }

    @Test("switches: GPIO lines, chip outputs or emulated; clashes and bad entries are named with their line")
    func switches() throws {
        let board = try BoardFile.parse(minimal + """

        servo:
          channels:
            - { channel: 0, output: 0 }
        switches:
          - { switch: 2, output: 12, safe: on }
          - { switch: 0, line: 5, chip: gpiochip1, active_low: true }
          - { switch: 1, emulated: true }
        """, path: "t.yaml")
        #expect(board.switches == [
            SwitchConfiguration(index: 0, output: .gpio(chip: "gpiochip1", line: 5, lineName: nil, activeLow: true)),
            SwitchConfiguration(index: 1, output: .emulated),
            SwitchConfiguration(index: 2, output: .pca9685(chip: 0, output: 12), safeOn: true),
        ])
        let bad = problems(minimal + """

        servo:
          channels:
            - { channel: 0, output: 0 }
        led: { line_name: GPIO17 }
        switches:
          - { switch: 0, output: 0 }
          - { switch: 1, line_name: GPIO17 }
          - { switch: 1, emulated: true }
          - { switch: 3 }
          - { switch: 4, emulated: true, output: 3 }
          - { switch: 300, emulated: true }
        """)
        #expect(bad.contains { $0.field == "switches[0].output" && $0.message.contains("already drives a channel") })
        #expect(bad.contains { $0.field == "switches[1]" && $0.message.contains("status LED") })
        #expect(bad.contains { $0.field == "switches[2].switch" && $0.message.contains("already defined") })
        #expect(bad.contains { $0.field == "switches[3]" && $0.message.contains("exactly one of") })
        #expect(bad.contains { $0.field == "switches[4]" })
        #expect(bad.contains { $0.field == "switches[5].switch" && $0.message.contains("out of range") })
        #expect(bad.allSatisfy { $0.line != nil })
    }

    @Test("The simulator board compiled into the binary is board/simulator.yaml (run scripts/embed-boards)")
    func embeddedCopyIsCurrent() throws {
        let file = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        #expect(EmbeddedBoards.simulator == String(file.dropLast(file.hasSuffix("\n") ? 1 : 0)))
    }

    @Test("board/raspberry-pi.yaml names the Pi's i2c-1, GPIO17 and the demo app's layout")
    func raspberryPiBoard() throws {
        let board = try BoardFile.load(path: repositoryRoot.appendingPathComponent("board/raspberry-pi.yaml").path)
        #expect(board.buses["i2c1"]?.kind == .device(path: "/dev/i2c-1"))
        // No chip: the line is found by name on whichever chip has it.
        #expect(board.led == .gpio(chip: "", line: nil, lineName: "GPIO17", activeLow: false))
        let servo = try #require(board.servo)
        #expect(servo.channels.map(\.role) == [.servo, .servo, .servo, .servo, .pwm, .pwm, .pwm, .pwm])
        #expect(board.switches.map(\.output) == (22...25).map { .gpio(chip: "", line: nil, lineName: "GPIO\($0)", activeLow: false) })
        #expect(board.tcp == nil)
        #expect(board.controlSocketPath == "/run/blecontrol/control.sock")
    }

    @Test("GPIO lines: a chip by device or label, none with a line name (every chip searched), gpiochip0 for an offset")
    func gpioChips() throws {
        let board = try BoardFile.parse(minimal + """

        led: { chip: pinctrl-rp1, line_name: GPIO17 }
        switches:
          - { switch: 0, line_name: GPIO22 }
          - { switch: 1, line: 23 }
          - { switch: 2, chip: /dev/gpiochip4, line_name: GPIO24 }
        """, path: "t.yaml")
        #expect(board.led == .gpio(chip: "pinctrl-rp1", line: nil, lineName: "GPIO17", activeLow: false))
        #expect(board.switches.map(\.output) == [
            .gpio(chip: "", line: nil, lineName: "GPIO22", activeLow: false),
            .gpio(chip: "gpiochip0", line: 23, lineName: nil, activeLow: false),
            .gpio(chip: "/dev/gpiochip4", line: nil, lineName: "GPIO24", activeLow: false),
        ])
        #expect(board.switches[0].output.description == "GPIO22")
        // The same name with no chip twice is the same line.
        let clash = problems(minimal + "\nled: { line_name: GPIO17 }\nswitches:\n  - { switch: 0, line_name: GPIO17 }\n")
        #expect(clash.contains { $0.field == "switches[0]" && $0.message == "GPIO17 is the status LED's line" }, "\(clash)")
    }

    @Test("I2C buses: a device, an adapter by name, or emulated; exactly one")
    func busKinds() throws {
        let board = try BoardFile.parse("""
        name: t
        buses:
          header: { adapter: "bcm2835 (i2c@7e804000)", max_write_bytes: 32 }
          usb: { device: /dev/i2c-7 }
          sim: { emulated: true }
        """, path: "t.yaml")
        #expect(board.buses["header"] == BusConfiguration(kind: .adapter(name: "bcm2835 (i2c@7e804000)"), maxWriteLength: 32))
        #expect(board.buses["usb"]?.kind == .device(path: "/dev/i2c-7"))
        #expect(board.buses["sim"]?.kind == .emulated)
        let bad = problems("""
        name: t
        buses:
          a: { adapter: "x", device: /dev/i2c-1 }
          b: { adapter: "x", byte_time_us: 90 }
          c: { adapter: "" }
          d: {}
        """)
        #expect(bad.contains { $0.field == "buses.a" && $0.message.contains("not device and adapter") }, "\(bad)")
        #expect(bad.contains { $0.field == "buses.b.byte_time_us" }, "\(bad)")
        #expect(bad.contains { $0.field == "buses.c.adapter" }, "\(bad)")
        #expect(bad.contains { $0.field == "buses.d" && $0.message.contains("adapter: NAME") }, "\(bad)")
    }

    @Test("Defaults fill a minimal file")
    func minimalFile() throws {
        let board = try BoardFile.parse(minimal, path: "t.yaml")
        #expect(board.servo == nil && board.lcd == nil && board.led == nil && board.tcp == nil)
        #expect(board.ble == BLEConfiguration(enabled: true, name: "BLEControl", adapter: "hci0"))
    }

    @Test("Unknown keys are reported with their line, as file:line: field: message")
    func unknownKey() {
        let found = problems(minimal + "\nservo:\n  frequncy_hz: 50\n  channels: []\n")
        #expect(found.count == 1)
        #expect(found.first?.line == 6)
        #expect(found.first?.field == "servo.frequncy_hz")
        #expect(found.first?.description.hasPrefix("test.yaml:6: servo.frequncy_hz: unknown key") == true)
    }

    @Test("Every problem is reported, not only the first")
    func severalProblems() {
        let found = problems("""
        name: t
        buses:
          main:
            emulated: true
        servo:
          address: 0x90
          frequency_hz: 5000
          channels:
            - { channel: 0, min_us: 2000, max_us: 1000 }
            - { channel: 0, role: motor }
        lcd:
          columns: 17
          pins: { rs: 0, rw: 0 }
        transports:
          tcp: { listen: "nowhere" }
        """)
        let fields = Set(found.map(\.field))
        #expect(fields.isSuperset(of: [
            "servo.address", "servo.frequency_hz", "servo.channels[0].min_us", "servo.channels[1].channel",
            "servo.channels[1].role", "lcd.columns", "lcd.pins", "transports.tcp.listen",
        ]), "\(found)")
        #expect(found.allSatisfy { $0.line != nil })
        #expect(found.first(where: { $0.field == "servo.address" })?.line == 6)
    }

    @Test("YAML syntax errors carry their line")
    func syntaxError() {
        let found = problems("name: t\nbuses:\n  main: [emulated\n")
        #expect(found.count == 1)
        #expect(found.first?.field == "yaml")
        #expect(found.first?.line != nil)
    }

    @Test("Structural mistakes are errors, not crashes", arguments: [
        "", "- a\n- b\n", "name: [1, 2]\nbuses: {}\n", "name: t\nbuses: 3\n", "name: t\nbuses:\n  main: {}\n",
        "name: t\nbuses:\n  main: { device: i2c-1 }\n", "name: t\nbuses:\n  main: { emulated: true, device: /dev/i2c-1 }\n",
        minimal + "\nled: { chip: gpiochip0 }\n", minimal + "\nled: { emulated: maybe }\n",
        minimal + "\nservo: { bus: other, channels: [] }\n", minimal + "\nservo: { channels: 7 }\n",
        minimal + "\nservo: { channels: [ { channel: 300 } ] }\n", minimal + "\nservo: { channels: [ { channel: 0, output: 16 } ] }\n",
        minimal + "\nservo: { channels: [ { channel: 0, role: esc, failsafe: hold } ] }\n",
        minimal + "\nservo: { channels: [ { channel: 0, failsafe: pulse, failsafe_us: 3000 } ] }\n",
        minimal + "\nlcd: { address: 0x40 }\nservo: { channels: [] }\n",
        minimal + "\nlcd: { columns: 40, rows: 4 }\n", minimal + "\nble: { name: \"" + String(repeating: "x", count: 30) + "\" }\n",
        minimal + "\ncontrol: { socket: relative.sock }\n", minimal + "\nprotocol: { idle_timeout_ms: -1 }\n",
        minimal + "\nname: again\n",
    ])
    func rejected(yaml: String) {
        #expect(!problems(yaml).isEmpty, "accepted: \(yaml)")
    }

    @Test("A missing file is a clear error")
    func missingFile() {
        do {
            _ = try BoardFile.load(path: "/nonexistent/board.yaml")
            Issue.record("loaded a missing file")
        } catch {
            #expect(error.description == "/nonexistent/board.yaml:0: file: no such file")
        }
    }

    @Test("Hex, decimal and separated numbers; HOST:PORT forms")
    func numbersAndEndpoints() throws {
        let board = try BoardFile.parse(minimal + """

        servo:
          address: 64
          oscillator_hz: 26_500_000
          channels: [ { channel: 9 } ]
        transports:
          tcp: { listen: "[::1]:0" }
        """, path: "t.yaml")
        #expect(board.servo?.chips.first?.address == I2CAddress(0x40))
        #expect(board.servo?.chips.first?.oscillator.value == 26_500_000)
        #expect(board.servo?.channels.first?.output == 9)
        #expect(board.tcp == TCPConfiguration(host: "::1", port: 0))
        #expect(TCPConfiguration(endpoint: "::1:80") == nil)
        #expect(TCPConfiguration(endpoint: "localhost:7171") == TCPConfiguration(host: "localhost", port: 7171))
        #expect(TCPConfiguration(endpoint: "127.0.0.1:70000") == nil)
    }

    @Test("The TCP transport listens beyond loopback only with allow_network: true", arguments: [
        ("0.0.0.0:7171", false), ("[::]:7171", false), ("192.168.1.20:7171", false), ("raspberrypi.local:7171", false),
        ("127.1:7171", false), ("0177.0.0.1:7171", false), ("127.0.0.1.example:7171", false),
        ("127.0.0.1:7171", true), ("127.8.9.10:0", true), ("[::1]:7171", true), ("localhost:7171", true),
    ])
    func tcpStaysOnLoopback(listen: String, loopback: Bool) throws {
        let file = minimal + "\ntransports:\n  tcp:\n    listen: \"\(listen)\"\n"
        let refused = problems(file).filter { $0.field == "transports.tcp.listen" }
        #expect(refused.isEmpty == loopback, "\(refused)")
        #expect(refused.allSatisfy { $0.line == 7 && $0.message.contains("allow_network: true") })
        let opened = try BoardFile.parse(file + "    allow_network: true\n", path: "t.yaml")
        #expect(opened.tcp.map { "\($0.host.contains(":") ? "[\($0.host)]" : $0.host):\($0.port)" } == listen)
        // Disabled, the address is not checked (nor used).
        #expect(problems(minimal + "\ntransports:\n  tcp:\n    enabled: false\n    listen: \"\(listen)\"\n").isEmpty)
    }

    /// Names in the board file's YAML, and whether each is fit. (A static
    /// list: string interpolation inside @Test's arguments crashes Swift
    /// 6.0.3's type checker, the floor.)
    static let outputNameCases: [(String, Bool)] = [
        ("steering", true), ("Lüfter ⚙", true), (#"'Arm "left" <b>&</b> \ end'"#, true), ("\"\(String(repeating: "x", count: 40))\"", true),
        ("\"\(String(repeating: "x", count: 41))\"", false), ("\"e\(String(repeating: "\\u0301", count: 80))\"", false),
        ("\"\\u202Eevil\"", false), ("\"bell\\x07\"", false), ("\"line\\u2028break\"", false), ("\"c1\\x85\"", false), ("\"   \"", false), ("\"\"", false),
    ]

    @Test("Names for outputs: plain text of 1 to 40 characters and 160 bytes; controls, separators and bidirectional overrides refused with their line", arguments: BoardFileTests.outputNameCases)
    func outputNames(name: String, fit: Bool) throws {
        let file = minimal + "\nservo:\n  channels:\n    - { channel: 0, output: 0, role: servo, name: \(name) }\nswitches:\n  - { switch: 0, emulated: true, name: \(name) }\nlcd:\n  bus: main\n  line_names: [\(name)]\n"
        let refused = problems(file)
        if fit {
            #expect(refused.isEmpty, "\(refused)")
            let board = try BoardFile.parse(file, path: "t.yaml")
            #expect(board.servo?.channels.first?.name == board.switches.first?.name)
        } else {
            #expect(refused.map(\.field).sorted() == ["lcd.line_names[0]", "servo.channels[0].name", "switches[0].name"], "\(refused)")
            #expect(refused.allSatisfy { ($0.line ?? 0) >= 7 })
        }
    }

    @Test("Thousands of mangled board files: each parses or is refused with located problems, never a crash")
    func mangled() throws {
        let original = EmbeddedBoards.simulator.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let replacements = ["", "-1", "0x", "99999999999999999999", "[", "{", "}", ":", "- ", "  ", "\t", "true", "~", "&a", "*a", "!!binary", "\"", "é", "0", "3.5", "nan"]
        var generator = SplitMix64(seed: 2026)
        var refused = 0
        for _ in 0..<1500 {
            var lines = original
            for _ in 0..<Int(generator.next() % 3 + 1) {
                let index = Int(generator.next() % UInt64(lines.count))
                switch generator.next() % 5 {
                case 0: lines.remove(at: index)
                case 1: lines.insert(lines[index], at: index)
                case 2:
                    var line = Array(lines[index])
                    if !line.isEmpty { line.remove(at: Int(generator.next() % UInt64(line.count))) }
                    lines[index] = String(line)
                default:
                    // Replace a value with something odd.
                    let line = lines[index]
                    let odd = replacements[Int(generator.next() % UInt64(replacements.count))]
                    if let colon = line.firstIndex(of: ":") { lines[index] = String(line[...colon]) + " " + odd } else { lines[index] = odd }
                }
                if lines.isEmpty { lines = [""] }
            }
            do {
                _ = try BoardFile.parse(lines.joined(separator: "\n"), path: "fuzz.yaml")
            } catch {
                refused += 1
                #expect(!error.problems.isEmpty)
                #expect(error.description.hasPrefix("fuzz.yaml:"))
            }
        }
        #expect(refused > 100)
    }

    @Test("BLE keys: security modes, power_on and an allow-list of addresses")
    func bleKeys() throws {
        let board = try BoardFile.parse(minimal + "\nble: { name: Rover, security: encrypted, power_on: false, allow: [\"AA:BB:CC:DD:EE:FF\"] }\n", path: "t.yaml")
        #expect(board.ble.name == "Rover")
        #expect(board.ble.powerOn == false)
        #expect(board.ble.allow.count == 1)
        #expect("\(board.ble.security)".contains("encrypted"))
        #expect(!problems(minimal + "\nble: { security: paranoid }\n").isEmpty)
        #expect(!problems(minimal + "\nble: { allow: [\"not-an-address\"] }\n").isEmpty)
    }
}
