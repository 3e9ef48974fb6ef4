#if canImport(Glibc)
import Glibc
#endif
import Arguments
import BLEControlProtocol
import Control
import Reactor

/// `blecontrol`: drive and inspect a running `blecontrold`.
let socketOption = CLICommand.Option("socket", value: "PATH", help: "The daemon's control socket.")

/// The control client for `--socket` (or the default path).
func connect(_ arguments: Parsed) throws -> ControlClient {
    do {
        return try ControlClient(path: arguments.option("socket") ?? ControlClient.defaultPath())
    } catch {
        throw ExitFailure("\(error)".printable)
    }
}

/// One request to the daemon; any failure becomes the command's clear
/// error (exit status 1).
func askDaemon<T>(_ arguments: Parsed, _ request: (ControlClient) throws -> T) throws -> T {
    do {
        return try request(try connect(arguments))
    } catch let failure as ExitFailure {
        throw failure
    } catch {
        // The daemon's words (an error reply) among them.
        throw ExitFailure("\(error)".printable)
    }
}

/// Sends frames through the control socket. For a command (`name`,
/// `words`): an ERROR is told with its reason from the board's status, and
/// a value for a channel that is not enabled says so; exit status 1 when
/// the board refused a frame.
func sendFrames(_ bytes: [UInt8], _ arguments: Parsed, command: (name: String, words: [String])? = nil, over: Duration? = nil) throws {
    try reportReplies(try askDaemon(arguments) { try $0.send(bytes, over: over) }, arguments, command: command)
}

/// The board's replies to `command`, as ``sendFrames(_:_:command:)`` tells them.
func reportReplies(_ replies: [UInt8], _ arguments: Parsed, command: (name: String, words: [String])?) throws {
    var board: StatusReport?
    func status() -> StatusReport? {
        if board == nil { board = try? askDaemon(arguments) { try $0.status() } }
        return board
    }
    let refused = FrameCommands.report(replies: replies) { code in
        guard let command, let report = status() else { return nil }
        return FrameCommands.reason(forError: code, name: command.name, words: command.words, status: report)
    }
    if refused { throw ExitFailure.silent(1) }
    if let command, ["servo", "pwm", "pulse"].contains(command.name), let number = command.words.first.flatMap(Int.init),
       let channel = status()?.channels.first(where: { $0.channel == number }), !channel.enabled {
        printError("note: channel \(number) is not enabled: it outputs nothing until `blecontrol enable \(number) on` (ANALOG_OUT_EN); the value is kept")
    }
}

let channelArgument = CLICommand.Positional("channel", help: "Channel 0…255.")

let status = Command("status", abstract: "Show outputs, display, LED, sessions and counters.",
                     examples: ["blecontrol status", "blecontrol status --json", "blecontrol status --mqtt rc-car@192.168.1.2"],
                     options: [socketOption, mqttOption] + mqttAccessOptions,
                     flags: [CLICommand.Flag("json", help: "One JSON object (snake_case keys), for scripts and tests.")]) { arguments in
    let report = arguments.option("mqtt") != nil ? try mqttStatus(arguments) : try askDaemon(arguments) { try $0.status() }
    if arguments.flag("json") {
        print(String(decoding: try JSONEncoderLite(pretty: true).encode(report), as: UTF8.self))
    } else {
        print(StatusText.render(report), terminator: "")
    }
}

/// A frame-sending command: its frames come from FrameCommands, and go
/// through the control socket or, with --ble, over the air.
func frameCommand(_ name: String, abstract: String, discussion: String = "", examples: [String], positionals: [CLICommand.Positional]) -> CLICommand {
    let values = name == "servo" || name == "pwm"
    let timed = values || name == "send"
    return CLICommand(name, abstract: abstract, examples: examples, discussion: discussion, options: (timed ? [overOption] : []) + deliveryOptions, flags: (values ? [rawFlag] : []) + deliveryFlags,
                      positionals: positionals) { arguments in
        try deliver(try FrameCommands.outgoing(name, arguments.positionals, raw: values && arguments.flag("raw")), arguments,
                    command: (name, arguments.positionals))
    }
}

let onOffArgument = CLICommand.Positional("state", help: "on or off (1/0, true/false).")
let frameCommands = [
    frameCommand("servo", abstract: "SERVO_VAL: a pulse of 1000 + VALUE µs on channel CH (500: 1500 µs, the centre).",
                 examples: ["blecontrol servo 0 500                    # 1500 µs, the centre", "blecontrol servo 0 800 --over 1.5s         # a timed move", "blecontrol servo 0 500 --ble BLEControl   # over the air"],
                 positionals: [channelArgument, CLICommand.Positional("value", help: "0…1000: 1000…2000 µs, clamped to the channel's calibration (--raw: any 16-bit value).")]),
    frameCommand("pwm", abstract: "PWM_VAL: duty VALUE/1000 on channel CH (250: 25 %).",
                 examples: ["blecontrol pwm 4 250                      # 25 %"],
                 positionals: [channelArgument, CLICommand.Positional("value", help: "0…1000 (per mille; --raw: any 16-bit value, negatives as the app's Int16).")]),
    frameCommand("enable", abstract: "ANALOG_OUT_EN: start or stop a channel's output.", examples: ["blecontrol enable 0 on"],
                 positionals: [channelArgument, onOffArgument]),
    frameCommand("switch", abstract: "SWITCH_VAL: a digital output on or off.", examples: ["blecontrol switch 1 on"],
                 positionals: [CLICommand.Positional("switch", help: "Switch 0…255."), onOffArgument]),
    frameCommand("lcd", abstract: "LCD_TEXT: show TEXT on LINE.",
                 examples: ["blecontrol lcd 0 'Hello'"],
                 positionals: [CLICommand.Positional("line", help: "Line 0…255 (0 is the top line)."),
                               CLICommand.Positional("text", help: "Text (UTF-8; cut at the display width by the board).")]),
    frameCommand("clear", abstract: "LCD_CLEAR: blank the display.", examples: ["blecontrol clear"],
                 positionals: []),
    frameCommand("init", abstract: "INIT: the handshake a central sends after connecting.", examples: ["blecontrol init"],
                 positionals: []),
    frameCommand("send", abstract: "Send raw bytes, e.g. `send 02 03 00 01 f4` or `send 020300:01f4`.",
                 discussion: "The bytes must end on a frame boundary: a trailing incomplete frame is refused (exit status 1) and nothing is sent.",
                 examples: ["blecontrol send 02 03 00 01 f4            # SERVO_VAL 500 on channel 0"],
                 positionals: [CLICommand.Positional("hex", help: "Hex bytes; spaces, colons and 0x prefixes are ignored.", variadic: true)]),
]

let pulse = CLICommand(
    "pulse", abstract: "A servo or ESC channel's pulse in µs, within its calibration.",
    examples: ["blecontrol pulse 0 1500", "blecontrol pulse 0 1750 --mqtt rc-car@192.168.1.2"],
    discussion: "The board turns the width into the SERVO_VAL that gives it with the channel's calibration (min_us, center_us, max_us, invert), as Home Assistant's pulse number does, and refuses a width outside min_us…max_us with the range: to find a servo's end stops, widen them in the board file and reload (docs/calibration.md). Through the control socket or --mqtt (…/pulse/N/set); over the air a central has no calibration to read, so --ble is refused.",
    options: [overOption] + deliveryOptions, flags: deliveryFlags,
    positionals: [channelArgument, CLICommand.Positional("microseconds", help: "The pulse width in µs, e.g. 1500 (a unit suffix us or µs is allowed).")]
) { arguments in
    guard arguments.positionals.count == 2 else { throw UsageError("pulse takes <channel> <microseconds>, e.g. `blecontrol pulse 0 1500`") }
    let channel = try number(arguments.positionals[0], "channel", UInt8.self)
    var text = arguments.positionals[1]
    for suffix in ["µs", "us"] where text.hasSuffix(suffix) { text = String(text.dropLast(suffix.count)) }
    guard let microseconds = Double(text), microseconds.isFinite, microseconds > 0, microseconds < 100_000 else {
        throw UsageError("<microseconds> must be a pulse width in µs such as 1500, got \(arguments.positionals[1])")
    }
    let over = try overDuration(arguments)
    if arguments.option("ble") != nil {
        throw UsageError("pulse needs the board's calibration, which a central cannot read over the air: run it on the board (the control socket) or with --mqtt; over the air, `blecontrol servo` takes 0…1000")
    }
    if arguments.option("mqtt") != nil {
        let link = try MQTTLink(arguments)
        defer { link.close() }
        try link.sendPulse(channel: channel, microseconds: microseconds)
        try link.finish(arguments)
        if link.replies.refused { throw ExitFailure.silent(1) }
        return
    }
    try reportReplies(try askDaemon(arguments) { try $0.pulse(channel: Int(channel), microseconds: microseconds, over: over) }, arguments,
                      command: ("pulse", arguments.positionals))
}

let watch = Command("watch", abstract: "A live view of the LCD text and every channel's pulse (Ctrl-C ends).",
                    examples: ["blecontrol watch", "blecontrol watch --interval 1000"],
                    options: [socketOption,
                              CLICommand.Option("interval", value: "MS", help: "Refresh interval in milliseconds (default 200)."),
                              CLICommand.Option("count", value: "N", help: "Stop after this many refreshes (default 0: run until interrupted).")]) { arguments in
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
            throw ExitFailure("\(error)".printable)
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

let failsafe = Command("failsafe", abstract: "End the board's failsafe on purpose, as the operator at the board.",
                       examples: ["sudo blecontrol failsafe clear"],
                       discussion: "Root or the daemon's own user (the simulator's owner) only; the daemon logs who did it. The outputs stay where the failsafe put them (a servo holding, an ESC stopped and latched) until a command moves them, exactly as when a central ends it: an ESC needs `blecontrol enable CH on` and a new value. A central ends a failsafe by commanding an output the central that left had commanded (docs/protocol.md, \"Failsafe\").",
                       options: [socketOption],
                       positionals: [CLICommand.Positional("action", help: "clear")]) { arguments in
    guard arguments.positionals == ["clear"] else {
        throw UsageError("failsafe takes one action: clear (got \(arguments.positionals.joined(separator: " ")))")
    }
    let cleared = try askDaemon(arguments) { try $0.clearFailsafe() }
    print(cleared.map { "failsafe cleared (was: \($0.printable)); the outputs stay as it left them until a command moves them" } ?? "no failsafe: nothing to clear")
}

let forgetBonds = Command("forget-bonds", abstract: "Forget every phone bonded with the board (ble.security: encrypted or authenticated); each must pair again.",
                          examples: ["sudo blecontrol forget-bonds"],
                          discussion: "Root only (or the daemon's own user): the daemon refuses anyone else. It asks bluetoothd to remove each bonded device of the board's adapter (its keys go; a connected one is disconnected) and prints the addresses forgotten. On the phone, forget the board too (iOS: Settings → Bluetooth → the board → Forget This Device), or it keeps trying its old keys.",
                          options: [socketOption]) { arguments in
    let forgotten = try askDaemon(arguments) { try $0.forgetBonds() }
    print(forgotten.isEmpty ? "no bonds to forget" : forgotten.map { "forgot \($0.printable)" }.joined(separator: "\n"))
}

/// What blecontrol(1) says beyond the commands and their options.
let manual = Manual(section: 1, sections: [
    Manual.Section("Over the air", [
        .paragraph("With --ble NAME|ADDRESS a frame-sending command (servo, pwm, enable, switch, lcd, clear, init, send, session) goes to the board as a BLE central would, through this machine's bluetoothd: it finds the board by its advertised name or address (FFE0 in the advertisement), connects, and writes to FFE1 with the original app's write types: SERVO_VAL, PWM_VAL and SWITCH_VAL without response, the others with response. ERROR notifications are printed as they come. --adapter picks the adapter, --timeout how long to look for the board (and to connect to it, never less than 30 s), --wait how long to listen for replies after the last write, --sync ends with a frame the board always answers. The adapter blecontrold advertises on cannot connect to its own board: use another one (a USB dongle, or another machine)."),
    ]),
    Manual.Section("Through an MQTT broker", [
        .paragraph("With --mqtt NAME@BROKER a frame-sending command (and session, and status) goes to the board NAME through an MQTT broker that the board's transports.mqtt connects to: the frames are published on PREFIX/NAME/frames and the board's ERROR replies come back on PREFIX/NAME/errors; status reads the board's retained PREFIX/NAME/status. The board must be online (its retained PREFIX/NAME/availability). --mqtt-user, --mqtt-password-file, --mqtt-ca-file, --mqtt-cert-file and --mqtt-key-file are the broker's credentials and TLS, as in the board file; --mqtt-prefix the topic prefix. `blecontrol fleet --mqtt BROKER` lists every board the broker knows. Needs libmosquitto1."),
    ]),
    Manual.Section("Exit status", [
        .item("0", "Done; the board accepted every frame."),
        .item("1", "The board refused a frame (its ERROR reply is printed), the daemon or the board could not be reached, or doctor found a problem."),
        .item("2", "The command line is wrong."),
    ]),
    Manual.Section("Environment", [
        .item("BLECONTROL_SOCKET", "The control socket, when --socket is not given."),
    ]),
    Manual.Section("Files", [
        .item("/run/blecontrol/control.sock", "The service's control socket (members of group blecontrol may use it)."),
        .item("$XDG_RUNTIME_DIR/blecontrol-simulator.sock", "The simulator board's control socket for this user, used when the service's is absent."),
        .item("/tmp/blecontrol-UID/simulator.sock", "The same without $XDG_RUNTIME_DIR (in a directory of mode 0700 the daemon makes)."),
        .item("/etc/blecontrol/board.yaml", "The board file doctor checks by default (blecontrol-board(5))."),
    ]),
    Manual.Section("Examples", [
        .paragraph("Centre the servo on channel 0 and show text on the top line:"),
        .example(["blecontrol enable 0 on", "blecontrol servo 0 500", "blecontrol lcd 0 'Hello'"]),
        .paragraph("The same over the air, to the board advertising as BLEControl:"),
        .example(["blecontrol --ble BLEControl servo 0 500"]),
        .paragraph("Several commands over one connection, waiting until the board has answered them all:"),
        .example(["printf 'enable 0 on\\nservo 0 250\\nsync\\n' | blecontrol session --ble BLEControl"]),
        .paragraph("Raw frames, as a central writes them (SERVO_VAL 500 on channel 0):"),
        .example(["blecontrol send 02 03 00 01 f4"]),
        .paragraph("Every board on a broker, then a servo on one of them:"),
        .example(["blecontrol fleet --mqtt 192.168.1.2", "blecontrol servo 0 500 --mqtt rc-car@192.168.1.2 --sync"]),
        .paragraph("Find what is wrong with an installation:"),
        .example(["sudo blecontrol doctor"]),
    ]),
    Manual.Section("See also", [
        .paragraph("blecontrold(8), blecontrol-board(5), bluetoothctl(1); /usr/share/doc/blecontrol/protocol.md"),
    ]),
])

Command(
    "blecontrol",
    abstract: "Drive and inspect a running blecontrold.",
    discussion: """
    Frames go through the daemon's control socket as one session, exactly as a central's would: the same dispatcher, \
    the same ERROR replies. The socket is --socket, else $BLECONTROL_SOCKET, else /run/blecontrol/control.sock if it \
    exists, else the simulator's of this user ($XDG_RUNTIME_DIR/blecontrol-simulator.sock, or \
    /tmp/blecontrol-UID/simulator.sock without it). A socket whose file or whose daemon belongs to a user other than \
    root, you or the service user blecontrol is refused before anything is sent. With --ble NAME|ADDRESS the frames go over the air \
    instead, through bluetoothd, to any board in range (`blecontrol scan` lists them); with --mqtt NAME@BROKER through \
    an MQTT broker (`blecontrol fleet --mqtt BROKER` lists the boards on it).
    """,
    subcommands: [status] + frameCommands + [pulse, sessionCommand(), scanCommand(), fleetCommand(), watch, failsafe, forgetBonds, webCommand(), doctorCommand()]
).main(version: BLEControlVersion.string, manual: manual, completion: true)
