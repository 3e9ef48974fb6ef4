#if canImport(Glibc)
import Glibc
#endif
import Arguments
import BLEControlProtocol
import Central
import Control
import Logging
import Reactor

let bleOption = CLICommand.Option("ble", value: "NAME|ADDRESS", help: "Send over the air to this board (its advertised name or address) through bluetoothd, as the original app would, instead of the control socket.")
let adapterOption = CLICommand.Option("adapter", value: "hciN", help: "With --ble or scan: the Bluetooth adapter to use (default: bluetoothd's first).")
let waitOption = CLICommand.Option("wait", value: "MS", help: "With --ble or --mqtt: how long to listen for ERROR replies after the last write (default 300).")
let syncFlag = CLICommand.Flag("sync", help: "With --ble or --mqtt: end with a frame the board always answers (FF 01 00: ERROR 255 comes back), so every reply before it has arrived; the board counts it as an error.")
let timeoutOption = CLICommand.Option("timeout", value: "S", help: "With --ble: how long to look for the board before giving up (default 20), and to connect to it and learn its services (never less than 30).")
let verboseFlag = CLICommand.Flag("verbose", help: "With --ble: say on stderr how long finding and connecting took.")

/// The options every frame-sending command takes.
let deliveryOptions = [socketOption, bleOption, adapterOption, timeoutOption, waitOption, mqttOption] + mqttAccessOptions
let deliveryFlags = [syncFlag, verboseFlag]

/// Sends `outgoing` through the control socket, or over the air (`--ble`)
/// or a broker (`--mqtt`); exit status 1 when the board refused a frame.
func deliver(_ outgoing: Outgoing, _ arguments: Parsed, command: (name: String, words: [String])? = nil) throws {
    let over = try overDuration(arguments)
    guard let link = try frameLink(arguments) else { return try sendFrames(outgoing.bytes, arguments, command: command, over: over) }
    defer { link.close() }
    try link.send(outgoing)
    try link.finish(arguments)
    if link.replies.refused { throw ExitFailure.silent(1) }
}

/// The link `--ble` or `--mqtt` asks for, nil for the control socket.
func frameLink(_ arguments: Parsed) throws -> (any FrameLink)? {
    if arguments.option("ble") != nil, arguments.option("mqtt") != nil { throw UsageError("--ble and --mqtt: one or the other") }
    if arguments.option("ble") != nil { return try BLESession(arguments) }
    if arguments.option("mqtt") != nil { return try MQTTLink(arguments) }
    return nil
}

/// A connection to one board that carries frames and brings its replies
/// back: over the air, or through a broker.
protocol FrameLink: AnyObject {
    var replies: ReplyWatch { get }
    func send(_ outgoing: Outgoing) throws
    func close()
}

extension FrameLink {
    /// Waits until the board has answered everything written so far: the
    /// marker's reply comes after every earlier reply on this link.
    func sync() throws {
        let wanted = replies.markerSent()
        try send(Outgoing(bytes: ReplyWatch.marker, withResponse: true))
        // A bound on a board that stopped answering, not a measurement.
        if !replies.waitForMarker(wanted, until: .now + .seconds(30)) {
            throw ExitFailure("the board did not answer within 30 s (still connected?)")
        }
    }

    /// After the last write: `--sync` waits for the board's answer to
    /// everything; otherwise ERROR replies are listened for `--wait`
    /// milliseconds.
    func finish(_ arguments: Parsed) throws {
        if arguments.flag("sync") { return try sync() }
        let wait = try arguments.integer("wait", in: 0...600_000, default: 300)
        sleepThread(.milliseconds(wait))
    }
}

/// The board's replies on a link (ERROR frames), printed as they come, and
/// the sync markers answered (on any thread).
final class ReplyWatch: @unchecked Sendable {
    /// The frame that always draws an answer: ERROR from a central, which
    /// the board refuses with ERROR 255 (docs/protocol.md, "ERROR").
    static let marker: [UInt8] = [0xFF, 0x01, 0x00]

    private let condition = Condition()
    private var decoder = FrameDecoder(configuration: .init(idleTimeout: nil))
    private var markersAnswered = 0
    private var markersSent = 0
    /// An ERROR came back for one of our frames.
    private(set) var refused = false

    /// Counts a marker about to be sent; returns how many must be answered.
    func markerSent() -> Int {
        condition.withLock {
            markersSent += 1
            return markersSent
        }
    }

    func waitForMarker(_ wanted: Int, until deadline: ContinuousClock.Instant) -> Bool {
        condition.withLock { () -> Bool in
            while markersAnswered < wanted {
                guard condition.wait(until: deadline) else { return markersAnswered >= wanted }
            }
            return true
        }
    }

    /// Bytes from the board (a notification, a message on `…/errors`).
    func received(_ bytes: [UInt8]) {
        condition.withLock {
            decoder.decode(bytes, at: .now) { event in
                guard case .message(let message) = event else { return }
                if message == .error(command: Self.marker[0]) {
                    markersAnswered += 1
                } else {
                    refused = FrameCommands.report(replies: FrameEncoder.encode(message)) || refused
                    fflush(nil)
                }
            }
            condition.broadcast()
        }
    }

    /// A refusal the link said in words (MQTT's text on `…/errors`).
    func refusedWith(_ text: String) {
        condition.withLock {
            refused = true
            print("board refused: \(text)")
            fflush(nil)
        }
    }
}

/// One BLE connection to a board for the lifetime of a command: the
/// writes, and the ERROR notifications printed as they come.
final class BLESession: FrameLink, @unchecked Sendable {
    private let central: BLECentral
    private let link: BoardLink
    let replies = ReplyWatch()

    init(_ arguments: Parsed) throws {
        guard let target = arguments.option("ble") else { throw UsageError("--ble NAME|ADDRESS is required") }
        var logger = Logger(label: "blecontrol")
        logger.logLevel = .critical
        let started = ContinuousClock.now
        do {
            central = try BLECentral(adapter: arguments.option("adapter"), logger: logger)
            let seconds = try arguments.integer("timeout", in: 1...600, default: 20)
            let board = try central.find(target, timeout: .seconds(seconds))
            let found = ContinuousClock.now
            let box = WeakBox<BLESession>()
            // Connecting includes bluetoothd's discovery of the board's
            // services, which a busy or slow bluetoothd stretches well past
            // a found board's advertising: 30 s at least, longer if asked.
            link = try central.connect(board, timeout: .seconds(max(30, seconds))) { bytes in box.value?.replies.received(bytes) }
            box.value = self
            if arguments.flag("verbose") {
                printError("blecontrol: found \(board.name.printable) (\(board.address.printable)) in \(Self.ms(started.duration(to: found))), connected and subscribed in \(Self.ms(found.duration(to: .now)))")
            }
        } catch let error as CentralError {
            // It names the device, by the name the device gave itself.
            throw ExitFailure("\(error)".printable)
        }
    }

    private static func ms(_ duration: Duration) -> String { "\((duration.inSeconds * 1000).fixed(0)) ms" }

    func close() {
        link.close()
        central.close()
    }

    func send(_ outgoing: Outgoing) throws {
        do {
            try link.write(outgoing.bytes, withResponse: outgoing.withResponse)
        } catch {
            throw ExitFailure("\(error)".printable)
        }
    }
}

/// A reference that does not keep its object alive (the notification
/// handler is made before the session that owns it exists).
final class WeakBox<Value: AnyObject>: @unchecked Sendable {
    weak var value: Value?
}

/// `blecontrol scan`.
func scanCommand() -> CLICommand { Command(
    "scan", abstract: "List the boards in range advertising the BLEControl service (FFE0): name, address, signal.",
    options: [adapterOption, CLICommand.Option("seconds", value: "S", help: "How long to listen (default 5).")]
) { arguments in
    let seconds = try arguments.integer("seconds", in: 1...600, default: 5)
    var logger = Logger(label: "blecontrol")
    logger.logLevel = .critical
    do {
        let central = try BLECentral(adapter: arguments.option("adapter"), logger: logger)
        defer { central.close() }
        var count = 0
        let started = ContinuousClock.now
        try central.scan(for: .seconds(seconds)) { board in
            count += 1
            let rssi = board.rssi.map { "\($0) dBm" } ?? "RSSI n/a"
            // The name is whatever the device advertises.
            print("\(board.address.printable)  \(rssi.padded(to: 9))  \(board.name.printable)  (after \((started.duration(to: .now).inSeconds * 1000).fixed(0)) ms)")
            fflush(nil)
        }
        if count == 0 { printError("blecontrol: no BLEControl board found in \(seconds) s") }
    } catch let error as CentralError {
        throw ExitFailure("\(error)".printable)
    }
} }

/// `blecontrol session`.
func sessionCommand() -> CLICommand { Command(
    "session", abstract: "Send a sequence of commands read from stdin, one a line, over one connection.",
    discussion: """
    Each line is a command as on the command line: servo CH VALUE, pwm CH VALUE, enable CH on|off, switch SW on|off, \
    lcd LINE TEXT…, clear, init, send HEX…; and `sync` (wait until the board has answered everything so far), \
    `wait MS` (pause). Blank lines and lines starting with # are skipped. With --ble the session keeps one BLE \
    connection (writes as the original app: servo, pwm and switch without response), with --mqtt one broker \
    connection; otherwise it uses the control socket. ERROR replies are printed as they arrive; exit status 1 if there was one or a line was wrong.
    """,
    options: deliveryOptions, flags: deliveryFlags
) { arguments in
    let link = try frameLink(arguments)
    defer { link?.close() }
    var failed = false
    var number = 0
    while let line = readLine() {
        number += 1
        let trimmed = line.trimmed
        guard !trimmed.isEmpty, !trimmed.hasPrefix("#") else { continue }
        let words = trimmed.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        do {
            switch words[0] {
            case "sync":
                try link?.sync()
            case "wait":
                guard words.count == 2, let ms = Int(words[1]), (0...600_000).contains(ms) else { throw UsageError("wait MS (0…600000)") }
                sleepThread(.milliseconds(ms))
            default:
                var commandWords = Array(words.dropFirst())
                if words[0] == "lcd", words.count > 1 {
                    // The text is the rest of the line as typed, spaces and all.
                    let afterCommand = trimmed.drop { $0 != " " }.drop { $0 == " " }
                    let text = afterCommand.drop { $0 != " " }.dropFirst()
                    commandWords = [words[1], String(text)]
                }
                // `--raw` anywhere on a servo or pwm line, as on the command line.
                let raw = ["servo", "pwm"].contains(words[0]) && commandWords.contains("--raw")
                if raw { commandWords.removeAll { $0 == "--raw" } }
                let outgoing = try FrameCommands.outgoing(words[0], commandWords, raw: raw)
                if let link {
                    try link.send(outgoing)
                } else {
                    try sendFrames(outgoing.bytes, arguments, command: (words[0], commandWords))
                }
            }
        } catch let failure as ExitFailure where failure.status == 1 && failure.description.isEmpty {
            // A refusal, already printed as the board's ERROR reply.
            failed = true
        } catch {
            printError("blecontrol: line \(number): \(error)")
            failed = true
        }
    }
    if let link {
        try link.finish(arguments)
        if link.replies.refused { failed = true }
    }
    if failed { throw ExitFailure.silent(1) }
} }
