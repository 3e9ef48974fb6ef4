#if canImport(Glibc)
import Glibc
#endif
import Arguments
import Board
import Control
import MQTT
import Reactor

let mqttOption = CLICommand.Option("mqtt", value: "NAME@BROKER", help: "Go through an MQTT broker (HOST or HOST:PORT) to the board NAME (its board file's name), instead of the control socket.")
let mqttBrokerOption = CLICommand.Option("mqtt", value: "BROKER", help: "The MQTT broker: HOST or HOST:PORT (1883, or 8883 with --mqtt-ca-file).")
/// The broker's credentials and TLS, as the board file's transports.mqtt has them.
let mqttAccessOptions = [
    CLICommand.Option("mqtt-user", value: "USER", help: "With --mqtt: the user name."),
    CLICommand.Option("mqtt-password-file", value: "FILE", help: "With --mqtt: a file whose first line is the password."),
    CLICommand.Option("mqtt-ca-file", value: "FILE", help: "With --mqtt: TLS, with this CA certificate (PEM)."),
    CLICommand.Option("mqtt-cert-file", value: "FILE", help: "With --mqtt and --mqtt-ca-file: a client certificate (PEM)."),
    CLICommand.Option("mqtt-key-file", value: "FILE", help: "With --mqtt-cert-file: its private key (PEM)."),
    CLICommand.Option("mqtt-prefix", value: "PREFIX", help: "With --mqtt: the boards' topic prefix (default blecontrol)."),
]

/// A connection to a broker for the lifetime of a command, on its own
/// event loop; what it receives is collected under a condition.
final class BrokerConnection: @unchecked Sendable {
    let prefix: String
    let broker: String
    private let loop: EventLoop
    private var client: MQTTClient?
    private let condition = Condition()
    private var outcome: Result<Void, MQTTError>?
    /// Retained and live messages on the topics subscribed, newest last.
    private var messages: [(topic: String, payload: [UInt8])] = []
    var onMessage: ((String, [UInt8]) -> Void)?

    /// Connects to `--mqtt`'s broker (`text`: HOST or HOST:PORT) and waits
    /// for the broker's answer.
    init(_ text: String, _ arguments: Parsed) throws {
        // A broker that closes the connection while we write (libmosquitto's
        // TLS writes go through OpenSSL's write()) is an error to report,
        // not a SIGPIPE that ends the command without a word.
        signal(SIGPIPE, SIG_IGN)
        prefix = arguments.option("mqtt-prefix") ?? "blecontrol"
        guard MQTTConfiguration.isTopicLevel(prefix, allowSlash: true) else { throw UsageError("--mqtt-prefix: \(prefix) is not a topic prefix") }
        let tls = arguments.option("mqtt-ca-file") != nil
        guard let parsed = MQTTConfiguration.broker(text, tls: tls) else { throw UsageError("--mqtt: \(text) is not HOST or HOST:PORT") }
        var endpoint = MQTTEndpoint(host: parsed.host, port: parsed.port, clientID: "blecontrol-cli-\(getpid())")
        broker = endpoint.description
        endpoint.keepalive = 10
        endpoint.username = arguments.option("mqtt-user")
        endpoint.caFile = arguments.option("mqtt-ca-file")
        endpoint.certFile = arguments.option("mqtt-cert-file")
        endpoint.keyFile = arguments.option("mqtt-key-file")
        do {
            if let file = arguments.option("mqtt-password-file") { endpoint.password = try MQTTEndpoint.password(from: file) }
            loop = try EventLoop(name: "blecontrol-mqtt")
        } catch {
            throw ExitFailure("\(error)")
        }
        loop.start()
        let ready = endpoint
        try loop.submitAndWait { [self] in
            let client = try MQTTClient(loop: loop, endpoint: ready)
            client.onConnect = { [weak self, weak client] code in
                self?.finished(code == 0 ? .success(()) : .failure(MQTTError("\(ready.description) refused the connection: \(client?.reason(code) ?? "\(code)")")))
            }
            client.onDisconnect = { [weak self, weak client] code in
                self?.finished(.failure(MQTTError("\(ready.description): \(client?.describe(code) ?? "\(code)")")))
            }
            client.onMessage = { [weak self] topic, payload, _ in self?.received(topic, payload) }
            self.client = client
            try client.connect()
        }
        let answered = condition.withLock { () -> Result<Void, MQTTError>? in
            let deadline = ContinuousClock.now + .seconds(15)
            while outcome == nil, condition.wait(until: deadline) {}
            return outcome
        }
        switch answered {
        case .success?: break
        case .failure(let error)?: throw ExitFailure("\(error)")
        case nil: throw ExitFailure("the broker \(broker) did not answer within 15 s")
        }
    }

    private func finished(_ result: Result<Void, MQTTError>) {
        condition.withLock {
            if outcome == nil { outcome = result }
            condition.broadcast()
        }
    }

    private func received(_ topic: String, _ payload: [UInt8]) {
        condition.withLock {
            messages.append((topic, payload))
            condition.broadcast()
        }
        onMessage?(topic, payload)
    }

    func subscribe(_ filters: [String], retained: Bool) throws {
        try loop.submitAndWait { [self] in
            for filter in filters {
                try client?.subscribe(filter, options: retained ? 0 : MQTTClient.noRetainedNoLocal)
            }
        }
    }

    func publish(_ topic: String, _ payload: [UInt8]) throws {
        let sent = try loop.submitAndWait { [self] in client?.publish(topic, payload) ?? false }
        if !sent { throw ExitFailure("the broker \(broker) went away") }
    }

    /// The messages so far, after waiting until `done` says enough or the
    /// deadline passes.
    func collect(until deadline: ContinuousClock.Instant, done: ([(topic: String, payload: [UInt8])]) -> Bool = { _ in false }) -> [(topic: String, payload: [UInt8])] {
        condition.withLock {
            while !done(messages), condition.wait(until: deadline) {}
            return messages
        }
    }

    func close() {
        _ = try? loop.submitAndWait { [self] in
            client?.disconnect()
            client = nil
        }
        loop.stop()
    }
}

/// `--mqtt NAME@BROKER`: frames to `PREFIX/NAME/frames`, replies from
/// `…/errors`. The board must be online (its retained availability).
final class MQTTLink: FrameLink, @unchecked Sendable {
    let replies = ReplyWatch()
    private let connection: BrokerConnection
    private let base: String

    init(_ arguments: Parsed) throws {
        guard let text = arguments.option("mqtt"), let at = text.lastIndex(of: "@"), at != text.startIndex else {
            throw UsageError("--mqtt wants NAME@BROKER, e.g. rc-car@192.168.1.2 (blecontrol fleet --mqtt BROKER lists the names)")
        }
        let name = MQTTConfiguration.topicName(String(text[..<at]))
        connection = try BrokerConnection(String(text[text.index(after: at)...]), arguments)
        base = "\(connection.prefix)/\(name)"
        let errors = "\(base)/errors"
        connection.onMessage = { [replies] topic, payload in
            guard topic == errors else { return }
            // An ERROR frame starts with FF; anything else is a refusal in words.
            if payload.first == 0xFF { replies.received(payload) } else { replies.refusedWith(.printable(payload)) }
        }
        do {
            try connection.subscribe([errors], retained: false)
            try connection.subscribe(["\(base)/availability"], retained: true)
        } catch {
            connection.close()
            throw ExitFailure("\(error)")
        }
        let availability = "\(base)/availability"
        let seen = connection.collect(until: .now + .seconds(3)) { $0.contains { $0.topic == availability } }
        let state = seen.last { $0.topic == availability }?.payload
        guard state == Array("online".utf8) else {
            connection.close()
            throw ExitFailure(state.map { "the board \(name) is \(String.printable($0)) on \(connection.broker)" }
                              ?? "no board \(name) on \(connection.broker) (nothing on \(availability); `blecontrol fleet --mqtt \(connection.broker)` lists the boards)")
        }
    }

    func send(_ outgoing: Outgoing) throws {
        try connection.publish("\(base)/frames", outgoing.bytes)
    }

    /// `…/pulse/N/set`: the board turns µs into a value with its calibration.
    func sendPulse(channel: UInt8, microseconds: Double) throws {
        try connection.publish("\(base)/pulse/\(channel)/set", Array("\(microseconds)".utf8))
    }

    func close() { connection.close() }
}

/// `status --mqtt NAME@BROKER`: the board's retained status.
func mqttStatus(_ arguments: Parsed) throws -> StatusReport {
    guard let text = arguments.option("mqtt"), let at = text.lastIndex(of: "@"), at != text.startIndex else {
        throw UsageError("--mqtt wants NAME@BROKER, e.g. rc-car@192.168.1.2")
    }
    let name = MQTTConfiguration.topicName(String(text[..<at]))
    let connection = try BrokerConnection(String(text[text.index(after: at)...]), arguments)
    defer { connection.close() }
    let topic = "\(connection.prefix)/\(name)/status"
    try connection.subscribe([topic], retained: true)
    guard let message = connection.collect(until: .now + .seconds(3), done: { !$0.isEmpty }).last else {
        throw ExitFailure("no status from the board \(name) on \(connection.broker) (nothing retained on \(topic))")
    }
    do {
        return try JSONDecoderLite().decode(StatusReport.self, from: message.payload)
    } catch {
        throw ExitFailure("the status on \(topic) is not one this blecontrol reads: \("\(error)".printable)")
    }
}

/// `blecontrol fleet`.
func fleetCommand() -> CLICommand { Command(
    "fleet", abstract: "List every board a broker knows: availability, version, failsafe, centrals.",
    discussion: "Reads the boards' retained availability and status topics (PREFIX/NAME/availability, PREFIX/NAME/status) for a moment (--wait) and lists each board once. A board that lost power shows offline once the broker has given up on it (1.5 times its keepalive).",
    options: [mqttBrokerOption] + mqttAccessOptions + [CLICommand.Option("wait", value: "MS", help: "How long to collect the retained topics (default 1000).")],
    flags: [CLICommand.Flag("json", help: "One JSON array, for scripts.")]
) { arguments in
    guard let broker = arguments.option("mqtt") else { throw UsageError("fleet needs --mqtt BROKER") }
    let wait = try arguments.integer("wait", in: 0...600_000, default: 1000)
    let connection = try BrokerConnection(broker, arguments)
    defer { connection.close() }
    let prefix = connection.prefix
    try connection.subscribe(["\(prefix)/+/availability", "\(prefix)/+/status"], retained: true)
    // Everything here is the broker's, and any client that may publish
    // there: the table shows it through String.printable, JSON escapes it.
    var boards: [String: (availability: [UInt8]?, status: StatusReport?)] = [:]
    for message in connection.collect(until: .now + .milliseconds(wait)) {
        let levels = message.topic.dropFirst(prefix.count + 1).split(separator: "/").map(String.init)
        guard levels.count == 2 else { continue }
        var entry = boards[levels[0]] ?? (nil, nil)
        if levels[1] == "availability" { entry.availability = message.payload }
        if levels[1] == "status" { entry.status = try? JSONDecoderLite().decode(StatusReport.self, from: message.payload) }
        boards[levels[0]] = entry
    }
    let rows = boards.keys.sorted().map { name -> (board: String, availability: [UInt8]?, version: String, failsafe: String, centrals: String) in
        let entry = boards[name]!
        let failsafe = entry.status.map { $0.servo?.failsafe ?? "off" } ?? "?"
        let centrals = entry.status.map { "\($0.sessions.filter { $0.transport != "control" }.count)" } ?? "?"
        return (name, entry.availability, entry.status?.version ?? "?", failsafe, centrals)
    }
    if arguments.flag("json") {
        let array = JSONValue.array(rows.map { row in
            .object([("board", .string(row.board)), ("availability", .string(row.availability.map { String(decoding: $0, as: UTF8.self) } ?? "?")),
                     ("version", .string(row.version)), ("failsafe", .string(row.failsafe)), ("centrals", .string(row.centrals))])
        })
        print(String(decoding: array.serialized(pretty: true), as: UTF8.self))
        return
    }
    guard !rows.isEmpty else {
        printError("blecontrol: no board on \(connection.broker) under \(prefix)/")
        return
    }
    print("BOARD".padded(to: 20) + "  " + "AVAILABILITY".padded(to: 12) + "  " + "VERSION".padded(to: 10) + "  CENTRALS  FAILSAFE")
    for row in rows {
        // The payload's own bytes: invalid UTF-8 shown as such, not as U+FFFD.
        let availability = row.availability.map { String.printable($0) } ?? "?"
        print(row.board.printable.padded(to: 20) + "  " + availability.padded(to: 12) + "  " + row.version.printable.padded(to: 10)
              + "  " + row.centrals.padded(to: 8) + "  " + row.failsafe.printable)
    }
} }
