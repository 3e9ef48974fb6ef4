import ArgumentParser
import BLEControlProtocol
import Firmware
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `blecontrol`: talk to a running `blecontrold` through its control socket.
struct BLEControlCLI: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blecontrol",
        abstract: "Drive and inspect a running blecontrold.",
        discussion: """
        Frames go through the daemon's control socket as one session, exactly as a \
        central's would: the same dispatcher, the same ERROR replies. The socket is \
        --socket, else $BLECONTROL_SOCKET, else /run/blecontrol/control.sock if it \
        exists, else the simulator's /tmp/blecontrol-simulator.sock.
        """,
        version: BLEControlVersion.string,
        subcommands: [Status.self, Servo.self, PWM.self, Enable.self, LCD.self, Clear.self, Init.self, Send.self, Watch.self, Doctor.self]
    )
}

struct ConnectionOptions: ParsableArguments {
    @Option(name: .long, help: "The daemon's control socket.")
    var socket: String?

    func connect() throws -> ControlClient {
        do {
            return try ControlClient(path: socket ?? ControlClient.defaultPath())
        } catch {
            throw CLIError("\(error)")
        }
    }
}

/// A failure the user should read, printed without a stack of prefixes.
struct CLIError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Sends frames and reports any ERROR reply; exit status 1 when the board
/// refused a frame.
func sendFrames(_ bytes: [UInt8], options: ConnectionOptions) throws {
    let client = try options.connect()
    let replies: [UInt8]
    do {
        replies = try client.send(bytes)
    } catch {
        throw CLIError("\(error)")
    }
    var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
    var refused = false
    decoder.decode(replies, at: .now) { event in
        switch event {
        case .message(.error(let command)):
            refused = true
            print("board replied ERROR for command \(command) (\(ControlProtocol.hex(FrameEncoder.encode(.error(command: command)))))")
        case .message(let message):
            print("board sent \(message)")
        case .error(let error):
            print("board sent an undecodable reply: \(error)")
        }
    }
    if refused { throw ExitCode(1) }
}

extension BLEControlCLI {
    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show outputs, display, LED, sessions and counters.")
        @OptionGroup var options: ConnectionOptions
        @Flag(name: .long, help: "One JSON object (snake_case keys), for scripts and tests.")
        var json = false

        func run() throws {
            let status: StatusReport
            do {
                status = try options.connect().status()
            } catch let error as CLIError {
                throw error
            } catch {
                throw CLIError("\(error)")
            }
            if json {
                let encoder = ControlProtocol.encoder()
                encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
                print(String(decoding: try encoder.encode(status), as: UTF8.self))
            } else {
                print(StatusText.render(status), terminator: "")
            }
        }
    }

    struct Servo: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "SERVO_VAL: pulse of 1000 + VALUE µs on channel CH.")
        @OptionGroup var options: ConnectionOptions
        @Argument(help: "Channel 0…255.") var channel: UInt8
        @Argument(help: "Value 0…65535 (0…1000 is the 1000…2000 µs servo range).") var value: UInt16
        func run() throws { try sendFrames(FrameEncoder.encode(.servo(channel: channel, value: value)), options: options) }
    }

    struct PWM: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "pwm", abstract: "PWM_VAL: duty VALUE/1000 on channel CH.")
        @OptionGroup var options: ConnectionOptions
        @Argument(help: "Channel 0…255.") var channel: UInt8
        @Argument(help: "Value 0…1000 (per mille).") var value: UInt16
        func run() throws { try sendFrames(FrameEncoder.encode(.pwm(channel: channel, value: value)), options: options) }
    }

    struct Enable: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "ANALOG_OUT_EN: start or stop a channel's output.")
        @OptionGroup var options: ConnectionOptions
        @Argument(help: "Channel 0…255.") var channel: UInt8
        @Argument(help: "on or off.") var state: OnOff
        func run() throws { try sendFrames(FrameEncoder.encode(.enable(channel: channel, on: state == .on)), options: options) }
    }

    enum OnOff: String, ExpressibleByArgument {
        case on, off
    }

    struct LCD: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "lcd", abstract: "LCD_TEXT: show TEXT on LINE.")
        @OptionGroup var options: ConnectionOptions
        @Argument(help: "Line 0…255 (0 is the top line).") var line: UInt8
        @Argument(help: "Text (UTF-8; cut at the display width by the board).") var text: String
        func validate() throws {
            if text.utf8.count > Message.maximumTextLength {
                throw ValidationError("the text is \(text.utf8.count) bytes; a frame carries at most \(Message.maximumTextLength)")
            }
        }
        func run() throws { try sendFrames(FrameEncoder.encode(.lcdText(line: line, text: Array(text.utf8))), options: options) }
    }

    struct Clear: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "LCD_CLEAR: blank the display.")
        @OptionGroup var options: ConnectionOptions
        func run() throws { try sendFrames(FrameEncoder.encode(.lcdClear), options: options) }
    }

    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "INIT: the handshake a central sends after connecting.")
        @OptionGroup var options: ConnectionOptions
        func run() throws { try sendFrames(FrameEncoder.encode(.initialize), options: options) }
    }

    struct Send: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Send raw bytes, e.g. `send 02 03 00 01 f4` or `send 020300:01f4`.")
        @OptionGroup var options: ConnectionOptions
        @Argument(parsing: .remaining, help: "Hex bytes; spaces, colons and 0x prefixes are ignored.") var hex: [String]
        func validate() throws {
            if ControlProtocol.bytes(fromHex: hex.joined(separator: " ")) == nil || hex.isEmpty {
                throw ValidationError("not hex bytes: \(hex.joined(separator: " "))")
            }
        }
        func run() throws { try sendFrames(ControlProtocol.bytes(fromHex: hex.joined(separator: " ")) ?? [], options: options) }
    }

    struct Watch: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "A live view of the LCD text and every channel's pulse (Ctrl-C ends).")
        @OptionGroup var options: ConnectionOptions
        @Option(name: .long, help: "Refresh interval in milliseconds.") var interval: Int = 200
        @Option(name: .long, help: "Stop after this many refreshes (0: run until interrupted).") var count: Int = 0

        func validate() throws {
            guard (20...60_000).contains(interval) else { throw ValidationError("--interval must be 20…60000 ms") }
            guard count >= 0 else { throw ValidationError("--count must not be negative") }
        }

        func run() throws {
            let client = try options.connect()
            let terminal = isatty(STDOUT_FILENO) == 1
            var shown = 0
            while count == 0 || shown < count {
                let status: StatusReport
                do {
                    status = try client.status()
                } catch {
                    throw CLIError("\(error)")
                }
                // Home the cursor and clear below it: redraws in place
                // without the flicker of a full clear.
                if terminal { print("\u{1B}[H\u{1B}[J", terminator: "") }
                print(StatusText.render(status), terminator: terminal ? "" : "\n")
                fflush(nil)  // all streams: `stdout` is a global var Swift 6 will not touch
                shown += 1
                if count == 0 || shown < count { usleep(useconds_t(interval * 1000)) }
            }
        }
    }
}

/// The human-readable status (also the `watch` screen).
enum StatusText {
    static func render(_ status: StatusReport) -> String {
        var out = "board \(status.board) \(status.simulated ? "(simulated) " : "")· blecontrold \(status.version) · up \(status.uptimeSeconds) s\n"
        if let lcd = status.lcd {
            out += "\nLCD \(lcd.columns)×\(lcd.rows) \(lcd.online ? "" : "OFFLINE\(lcd.error.map { ": \($0)" } ?? "")")\n"
            let border = "+" + String(repeating: "-", count: lcd.columns) + "+\n"
            out += border
            for line in lcd.lines { out += "|\(line.padding(toLength: lcd.columns, withPad: " ", startingAt: 0))|\n" }
            out += border
        }
        if !status.channels.isEmpty {
            if let servo = status.servo {
                out += "\nPCA9685 \(servo.frequencyHz) Hz \(servo.online ? "online" : "OFFLINE\(servo.error.map { ": \($0)" } ?? "")")"
                if let p50 = servo.latencyP50Us, let p99 = servo.latencyP99Us { out += " · latency p50 \(p50) µs p99 \(p99) µs" }
                out += " · \(servo.scheduling)\n"
                if let failsafe = servo.failsafe { out += "FAILSAFE: \(failsafe)\n" }
                out += "  \(servo.flushes) flushes, \(servo.busWrites) bus writes, \(servo.coalesced) coalesced, \(servo.deadlineMisses) deadline misses, \(servo.failsafes) failsafes\n"
            }
            out += "  ch out role   enabled  last          pulse µs   duty\n"
            for channel in status.channels {
                let last = channel.command.map { "\($0) \(channel.value ?? 0)" } ?? "-"
                out += "  " + pad(channel.channel, 2) + " " + pad(channel.output, 3) + " " + channel.role.padding(toLength: 6, withPad: " ", startingAt: 0)
                out += " " + (channel.latched ? "latched" : channel.enabled ? "yes" : "no ").padding(toLength: 8, withPad: " ", startingAt: 0)
                out += " " + last.padding(toLength: 13, withPad: " ", startingAt: 0)
                out += " " + pad(String(format: "%.1f", channel.pulseUs), 8) + "  " + pad(String(format: "%.1f%%", channel.duty * 100), 6) + "\n"
            }
        }
        if let led = status.led { out += "\nLED \(led.pattern) (\(led.lit ? "lit" : "dark"))\n" }
        out += "\nsessions: \(status.sessions.count)"
        for session in status.sessions { out += "\n  #\(session.id) \(session.transport) \(session.peer): \(session.frames) frames, \(session.errors) errors" }
        out += "\ncounters: \(status.counters.frames) frames, \(status.counters.errors) errors, \(status.counters.discardedPartials) partial frames discarded\n"
        for (name, state) in status.transports.sorted(by: { $0.key < $1.key }) { out += "\(name): \(state)\n" }
        return out
    }

    private static func pad(_ value: some CustomStringConvertible, _ width: Int) -> String {
        let text = value.description
        return String(repeating: " ", count: max(0, width - text.count)) + text
    }
}

BLEControlCLI.main()
