#if canImport(Glibc)
import Glibc
#endif
import Arguments
import BLEControlProtocol
import Control
import Reactor

/// `blecontrol`: drive and inspect a running `blecontrold`.
let socketOption = Command.Option("socket", value: "PATH", help: "The daemon's control socket.")

/// The control client for `--socket` (or the default path).
func connect(_ arguments: Parsed) throws -> ControlClient {
    do {
        return try ControlClient(path: arguments.option("socket") ?? ControlClient.defaultPath())
    } catch {
        throw ExitFailure("\(error)")
    }
}

/// Sends frames and reports any ERROR reply; exit status 1 when the board
/// refused a frame.
func sendFrames(_ bytes: [UInt8], _ arguments: Parsed) throws {
    let replies: [UInt8]
    do {
        replies = try connect(arguments).send(bytes)
    } catch let failure as ExitFailure {
        throw failure
    } catch {
        throw ExitFailure("\(error)")
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
        case .provisional:
            break
        }
    }
    if refused { throw ExitFailure.silent(1) }
}

func number<T: FixedWidthInteger>(_ text: String, _ name: String, _ type: T.Type) throws -> T {
    guard let value = T(text) else { throw UsageError("<\(name)> must be a whole number \(T.min)…\(T.max), got \(text)") }
    return value
}

/// on/off, 1/0, true/false, yes/no.
func onOff(_ text: String, _ name: String) throws -> Bool {
    switch text.lowercased() {
    case "on", "1", "true", "yes": return true
    case "off", "0", "false", "no": return false
    default: throw UsageError("<\(name)> must be on or off (or 1/0, true/false), got \(text)")
    }
}

/// A PWM or servo value: 0…65535, or a negative Int16 sent as the original
/// app does (two's complement: -500 is FE 0C).
func wireValue(_ text: String) throws -> UInt16 {
    if let value = UInt16(text) { return value }
    if let negative = Int16(text) { return UInt16(bitPattern: negative) }
    throw UsageError("<value> must be -32768…65535, got \(text)")
}

let channelArgument = Command.Positional("channel", help: "Channel 0…255.")

let status = Command("status", abstract: "Show outputs, display, LED, sessions and counters.",
                     options: [socketOption], flags: [Command.Flag("json", help: "One JSON object (snake_case keys), for scripts and tests.")]) { arguments in
    let report: StatusReport
    do {
        report = try connect(arguments).status()
    } catch let failure as ExitFailure {
        throw failure
    } catch {
        throw ExitFailure("\(error)")
    }
    if arguments.flag("json") {
        print(String(decoding: try JSONEncoderLite(pretty: true).encode(report), as: UTF8.self))
    } else {
        print(StatusText.render(report), terminator: "")
    }
}

let servo = Command("servo", abstract: "SERVO_VAL: pulse of 1000 + VALUE µs on channel CH.", options: [socketOption],
                    positionals: [channelArgument, Command.Positional("value", help: "0…65535 (0…1000 is the 1000…2000 µs servo range).")]) { arguments in
    let channel = try number(arguments.positionals[0], "channel", UInt8.self)
    try sendFrames(FrameEncoder.encode(.servo(channel: channel, value: try wireValue(arguments.positionals[1]))), arguments)
}

let pwm = Command("pwm", abstract: "PWM_VAL: duty VALUE/1000 on channel CH.", options: [socketOption],
                  positionals: [channelArgument, Command.Positional("value", help: "0…1000 (per mille); negative values go as the app's Int16.")]) { arguments in
    let channel = try number(arguments.positionals[0], "channel", UInt8.self)
    try sendFrames(FrameEncoder.encode(.pwm(channel: channel, value: try wireValue(arguments.positionals[1]))), arguments)
}

let enable = Command("enable", abstract: "ANALOG_OUT_EN: start or stop a channel's output.", options: [socketOption],
                     positionals: [channelArgument, Command.Positional("state", help: "on or off (1/0, true/false).")]) { arguments in
    let channel = try number(arguments.positionals[0], "channel", UInt8.self)
    try sendFrames(FrameEncoder.encode(.enable(channel: channel, on: try onOff(arguments.positionals[1], "state"))), arguments)
}

let switchCommand = Command("switch", abstract: "SWITCH_VAL: a digital output on or off.", options: [socketOption],
                            positionals: [Command.Positional("switch", help: "Switch 0…255."), Command.Positional("state", help: "on or off (1/0, true/false).")]) { arguments in
    let index = try number(arguments.positionals[0], "switch", UInt8.self)
    try sendFrames(FrameEncoder.encode(.switchValue(index: index, on: try onOff(arguments.positionals[1], "state"))), arguments)
}

let lcd = Command("lcd", abstract: "LCD_TEXT: show TEXT on LINE.", options: [socketOption],
                  positionals: [Command.Positional("line", help: "Line 0…255 (0 is the top line)."),
                                Command.Positional("text", help: "Text (UTF-8; cut at the display width by the board).")]) { arguments in
    let line = try number(arguments.positionals[0], "line", UInt8.self)
    let text = arguments.positionals[1]
    guard text.utf8.count <= Message.maximumTextLength else {
        throw UsageError("the text is \(text.utf8.count) bytes; a frame carries at most \(Message.maximumTextLength)")
    }
    try sendFrames(FrameEncoder.encode(.lcdText(line: line, text: Array(text.utf8))), arguments)
}

let clear = Command("clear", abstract: "LCD_CLEAR: blank the display.", options: [socketOption]) { arguments in
    try sendFrames(FrameEncoder.encode(.lcdClear), arguments)
}

let initCommand = Command("init", abstract: "INIT: the handshake a central sends after connecting.", options: [socketOption]) { arguments in
    try sendFrames(FrameEncoder.encode(.initialize), arguments)
}

let send = Command("send", abstract: "Send raw bytes, e.g. `send 02 03 00 01 f4` or `send 020300:01f4`.",
                   discussion: "The bytes must end on a frame boundary: a trailing incomplete frame is refused (exit status 1) and nothing is sent.",
                   options: [socketOption], positionals: [Command.Positional("hex", help: "Hex bytes; spaces, colons and 0x prefixes are ignored.", variadic: true)]) { arguments in
    let text = arguments.positionals.joined(separator: " ")
    guard !arguments.positionals.isEmpty, let bytes = ControlProtocol.bytes(fromHex: text), !bytes.isEmpty else {
        throw UsageError("not hex bytes: \(text)")
    }
    var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
    decoder.decode(bytes, at: .now) { _ in }
    if decoder.hasPartialFrame {
        let pending = decoder.bufferedByteCount
        throw ExitFailure("the last \(pending) byte\(pending == 1 ? "" : "s") (\(ControlProtocol.hex(bytes.suffix(pending)))) are an incomplete frame; nothing was sent")
    }
    try sendFrames(bytes, arguments)
}

let watch = Command("watch", abstract: "A live view of the LCD text and every channel's pulse (Ctrl-C ends).",
                    options: [socketOption,
                              Command.Option("interval", value: "MS", help: "Refresh interval in milliseconds (default 200)."),
                              Command.Option("count", value: "N", help: "Stop after this many refreshes (default 0: run until interrupted).")]) { arguments in
    let interval = try arguments.integer("interval", in: 20...60_000, default: 200)
    let count = try arguments.integer("count", in: 0...Int.max, default: 0)
    let client = try connect(arguments)
    let terminal = isatty(STDOUT_FILENO) == 1
    var shown = 0
    while count == 0 || shown < count {
        let report: StatusReport
        do {
            report = try client.status()
        } catch {
            throw ExitFailure("\(error)")
        }
        // Home the cursor and clear below it: redraws in place without the
        // flicker of a full clear.
        if terminal { print("\u{1B}[H\u{1B}[J", terminator: "") }
        print(StatusText.render(report), terminator: terminal ? "" : "\n")
        fflush(nil)
        shown += 1
        if count == 0 || shown < count { sleepThread(.milliseconds(interval)) }
    }
}

Command(
    "blecontrol",
    abstract: "Drive and inspect a running blecontrold.",
    discussion: """
    Frames go through the daemon's control socket as one session, exactly as a central's would: the same dispatcher, \
    the same ERROR replies. The socket is --socket, else $BLECONTROL_SOCKET, else /run/blecontrol/control.sock if it \
    exists, else the simulator's /tmp/blecontrol-simulator.sock.
    """,
    subcommands: [status, servo, pwm, enable, switchCommand, lcd, clear, initCommand, send, watch, doctorCommand()]
).main(version: BLEControlVersion.string)
