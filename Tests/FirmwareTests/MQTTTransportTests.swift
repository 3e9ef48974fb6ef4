import BLEControlProtocol
import Board
import Control
import Foundation
import Reactor
import Testing
@testable import Firmware

/// Debian's Mosquitto broker on a private port, with a password file and
/// an ACL (the test task installs it: scripts/lib/packages).
private final class Broker {
    static let binary = "/usr/sbin/mosquitto"
    static var available: Bool { FileManager.default.isExecutableFile(atPath: binary) }

    let directory: String
    let port: UInt16
    private var process: Process?

    init() throws {
        directory = scratchDirectory("blecontrol-mqtt")
        port = try Broker.freePort()
        // board: may publish and read its own topics; operator: commands.
        try run("/usr/bin/mosquitto_passwd", ["-c", "-b", "\(directory)/passwords", "board", "board-secret"])
        try run("/usr/bin/mosquitto_passwd", ["-b", "\(directory)/passwords", "operator", "operator-secret"])
        try """
        user board
        topic readwrite blecontrol/#
        topic readwrite homeassistant/#
        user operator
        topic readwrite blecontrol/#
        topic read homeassistant/#

        """.write(toFile: "\(directory)/acl", atomically: true, encoding: .utf8)
        try """
        listener \(port) 127.0.0.1
        allow_anonymous false
        password_file \(directory)/passwords
        acl_file \(directory)/acl
        persistence false
        log_dest file \(directory)/broker.log

        """.write(toFile: "\(directory)/mosquitto.conf", atomically: true, encoding: .utf8)
        try "board-secret\n".write(toFile: "\(directory)/board.password", atomically: true, encoding: .utf8)
        try start()
    }

    deinit { stop() }

    /// Starts the broker and waits until it accepts connections.
    func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Broker.binary)
        process.arguments = ["-c", "\(directory)/mosquitto.conf"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        #expect(eventually { Broker.accepts(self.port) }, "mosquitto did not listen on \(port)")
    }

    /// Kills the broker without a word to its clients (SIGKILL).
    func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    /// The board file's `transports.mqtt` for this broker.
    func boardYAML(password: String = "board.password", keepalive: Int = 5) -> String {
        testBoard(silenceMs: 0).replacingOccurrences(of: "transports:\n", with: """
        transports:
          mqtt:
            broker: 127.0.0.1:\(port)
            username: board
            password_file: \(directory)/\(password)
            keepalive_s: \(keepalive)
            status_interval_ms: 100

        """)
    }

    /// `mosquitto_pub` as the operator.
    func publish(_ topic: String, _ payload: [UInt8], retain: Bool = false) throws {
        let file = "\(directory)/payload-\(UUID().uuidString)"
        try Data(payload).write(to: URL(fileURLWithPath: file))
        try run("/usr/bin/mosquitto_pub", ["-p", "\(port)", "-u", "operator", "-P", "operator-secret", "-t", topic, "-f", file] + (retain ? ["-r"] : []))
    }

    func publish(_ topic: String, _ text: String, retain: Bool = false) throws {
        try publish(topic, Array(text.utf8), retain: retain)
    }

    /// The retained message on `topic` (as hex when `hex`), or nil.
    func retained(_ topic: String, hex: Bool = false) -> String? {
        // "Timed out" (on stderr) when there is none.
        subscribe(["-t", topic, "-C", "1", "-W", "3", "-F", hex ? "%x" : "%p"]).first { $0 != "Timed out" }
    }

    /// `mosquitto_sub --retained-only` as the operator: its output lines.
    /// Spawned with no signal blocked (Subprocess), so its -W timer works:
    /// a child started by Foundation's Process would inherit the test
    /// process's blocked SIGALRM and wait for ever.
    private func subscribe(_ arguments: [String]) -> [String] {
        let out = Subprocess.output(of: "/usr/bin/mosquitto_sub", ["-p", "\(port)", "-u", "operator", "-P", "operator-secret", "--retained-only"] + arguments,
                                    timeout: .seconds(20)) ?? ""
        return out.split(separator: "\n").map(String.init)
    }

    /// Every retained message under `filter`, by topic (payload as text).
    func retainedAll(_ filter: String) -> [String: String] {
        var result: [String: String] = [:]
        for line in subscribe(["-t", filter, "-W", "2", "-F", "%t\t%p"]) {
            let parts = line.split(separator: "\t", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { result[String(parts[0])] = String(parts[1]) }
        }
        return result
    }

    private static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return UInt16(bigEndian: address.sin_port)
    }

    private static func accepts(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

/// A `mosquitto_sub` that records what arrives, as `topic hexpayload` lines.
private final class Subscriber: @unchecked Sendable {
    private let process = Process()
    private let pipe = Pipe()
    private let lock = NSLock()
    private var text = ""

    init(_ broker: Broker, topics: [String]) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/mosquitto_sub")
        process.arguments = ["-p", "\(broker.port)", "-u", "operator", "-P", "operator-secret", "-F", "%t %x"]
            + (topics + ["blecontrol/test/probe"]).flatMap { ["-t", $0] }
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self else { return }
            self.lock.withLock { self.text += String(decoding: data, as: UTF8.self) }
        }
        try process.run()
        // Subscribed once a probe comes back: what is published after this
        // reaches it.
        var probes = 0
        #expect(eventually {
            probes += 1
            try? broker.publish("blecontrol/test/probe", "\(probes)")
            return self.lines.contains { $0.hasPrefix("blecontrol/test/probe ") }
        }, "mosquitto_sub never subscribed")
    }

    deinit {
        pipe.fileHandleForReading.readabilityHandler = nil
        // SIGKILL: Process starts it with the test process's signal mask,
        // SIGTERM blocked.
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    var lines: [String] { lock.withLock { text.split(separator: "\n").map(String.init) } }

    /// The payloads (hex) that arrived on `topic`.
    func payloads(_ topic: String) -> [String] {
        lines.compactMap { line in line.hasPrefix(topic + " ") ? String(line.dropFirst(topic.count + 1)) : nil }
    }
}

@discardableResult
private func run(_ path: String, _ arguments: [String]) throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

private extension RunningBoard {
    var mqttState: String { (try? runtime.status().transports.mqtt) ?? "" }
    var mqttSession: StatusReport.SessionInfo? { (try? runtime.status().sessions)?.first { $0.transport == "mqtt" } }
}

private func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

@Suite("The MQTT transport, on a real Mosquitto broker", .serialized, .enabled(if: Broker.available, "needs Debian's mosquitto (scripts/install-deps unit)"))
struct MQTTTransportTests {
    @Test("Per-output topics and raw frames drive the outputs; ERROR replies and refusals go to …/errors; online, status and failsafe retained")
    func commands() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML())
        #expect(eventually { board.mqttState.hasPrefix("connected to 127.0.0.1:\(broker.port)") }, "\(board.mqttState)")
        let base = "blecontrol/simulator"
        #expect(eventually { broker.retained("\(base)/availability") == "online" })
        let errors = try Subscriber(broker, topics: ["\(base)/errors"])

        try broker.publish("\(base)/enable/0/set", "ON")
        try broker.publish("\(base)/servo/0/set", "600")
        #expect(eventually { abs(board.pulse(0) - 1600) < 5 })

        // The demo app's bytes, as a BLE central writes them, and a command
        // that does not exist: ERROR 09 back, as a notification would be.
        var frames: [UInt8] = []
        FrameEncoder.encode(.enable(channel: 3, on: true), into: &frames)
        FrameEncoder.encode(.servo(channel: 3, value: 250), into: &frames)
        FrameEncoder.encode(.lcdText(line: 0, text: Array("over MQTT".utf8)), into: &frames)
        try broker.publish("\(base)/frames", frames + [0x09, 0x00])
        #expect(eventually { errors.payloads("\(base)/errors").contains("ff0109") }, "\(errors.lines)")
        #expect(abs(board.pulse(3) - 1250) < 5)
        #expect(board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("over MQTT") == true)

        // A frame cut at the end of its message is not finished by the next
        // message: discarded, and the next message's frame applies whole.
        try broker.publish("\(base)/frames", [0x02, 0x03, 0x00])
        try broker.publish("\(base)/frames", FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { abs(board.pulse(0) - 1100) < 5 })

        // A payload a person might mistype: refused with the reason, nothing moves.
        try broker.publish("\(base)/servo/0/set", "fast")
        #expect(eventually { errors.payloads("\(base)/errors").contains(hex(Array("\(base)/servo/0/set: \"fast\" is not a value 0…1000".utf8))) },
                "\(errors.lines)")
        try broker.publish("\(base)/servo/9/set", "500")  // no channel 9: ERROR 02, as over BLE
        #expect(eventually { errors.payloads("\(base)/errors").contains("ff0102") }, "\(errors.lines)")
        #expect(abs(board.pulse(0) - 1100) < 5)

        #expect(eventually { broker.retained("\(base)/failsafe") == "OFF" })
        #expect(eventually { broker.retained("\(base)/status")?.contains("\"board\":\"simulator\"") == true })
        let session = try #require(board.mqttSession)
        #expect(session.peer == "127.0.0.1:\(broker.port)")
        board.runtime.stop()
        #expect(broker.retained("\(base)/availability") == "offline", "a clean stop says offline (a clean disconnect sends no will)")
    }

    @Test("A retained command is never applied: not at start, not after the broker comes back")
    func retainedIgnored() throws {
        let broker = try Broker()
        let base = "blecontrol/simulator"
        // Left on the broker by someone before the board starts.
        try broker.publish("\(base)/enable/1/set", "ON", retain: true)
        try broker.publish("\(base)/servo/1/set", "900", retain: true)
        try broker.publish("\(base)/frames", FrameEncoder.encode(.enable(channel: 2, on: true)) + FrameEncoder.encode(.servo(channel: 2, value: 800)), retain: true)
        let board = try RunningBoard(yaml: broker.boardYAML())
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        // A live command after the retained ones: once it is applied, the
        // broker has delivered everything it was going to before it.
        try broker.publish("\(base)/enable/0/set", "ON")
        try broker.publish("\(base)/servo/0/set", "500")
        #expect(eventually { abs(board.pulse(0) - 1500) < 5 })
        #expect(board.pulse(1) == 0 && board.pulse(2) == 0, "retained commands moved nothing")
        #expect(board.mqttSession?.frames == 2)

        broker.stop()
        #expect(eventually { (try? board.servo().failsafe)?.contains("last central disconnected (mqtt 127.0.0.1:\(broker.port))") == true })
        try broker.start()
        #expect(eventually(timeout: .seconds(60)) { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        try broker.publish("\(base)/servo/0/set", "300")
        #expect(eventually { abs(board.pulse(0) - 1300) < 5 }, "the first live command after the reconnect clears the failsafe")
        #expect(board.pulse(1) == 0 && board.pulse(2) == 0)
        #expect(board.mqttSession?.frames == 1, "a new session: nothing replayed")
    }

    @Test("Losing the broker is losing the central: failsafe, retried with a back-off, online again; a wrong password is refused and said")
    func brokerLoss() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML())
        let base = "blecontrol/simulator"
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        try broker.publish("\(base)/enable/4/set", "ON")
        try broker.publish("\(base)/servo/4/set", "700")  // the ESC
        #expect(eventually { abs(board.pulse(4) - 1700) < 5 })

        broker.stop()
        #expect(eventually { (try? board.servo().failsafe) != nil })
        #expect(eventually { abs(board.pulse(4) - 1000) < 5 }, "the ESC at its failsafe pulse")
        #expect(eventually { board.mqttState.contains("retrying in") }, "\(board.mqttState)")
        try broker.start()
        #expect(eventually(timeout: .seconds(60)) { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        #expect(eventually { broker.retained("\(base)/availability") == "online" })
        #expect(eventually { broker.retained("\(base)/failsafe") == "ON" }, "the failsafe holds until a command arrives")
        #expect(abs(board.pulse(4) - 1700) > 5, "the ESC did not go back to its last command")

        let refused = try RunningBoard(yaml: broker.boardYAML(password: "acl").replacingOccurrences(of: "name: simulator", with: "name: other"))
        #expect(eventually { refused.mqttState.contains("refused the connection") }, "\(refused.mqttState)")
        #expect(try refused.runtime.status().sessions.allSatisfy { $0.transport != "mqtt" })
    }
}

/// The keys Home Assistant's MQTT platforms document for discovery
/// payloads (full names; the abbreviations are not used), per component,
/// and those each requires.
private let homeAssistantKeys: [String: (allowed: Set<String>, required: Set<String>)] = {
    let common: Set<String> = ["name", "unique_id", "availability_topic", "device", "object_id", "icon", "entity_category", "enabled_by_default",
                               "payload_available", "payload_not_available", "qos", "encoding", "json_attributes_topic", "default_entity_id"]
    return [
        "number": (common.union(["command_topic", "command_template", "state_topic", "value_template", "min", "max", "step", "mode",
                                 "optimistic", "retain", "unit_of_measurement", "device_class", "payload_reset"]), ["command_topic"]),
        "switch": (common.union(["command_topic", "state_topic", "value_template", "payload_on", "payload_off", "state_on", "state_off",
                                 "optimistic", "retain", "device_class"]), ["command_topic"]),
        "text": (common.union(["command_topic", "command_template", "state_topic", "value_template", "min", "max", "mode", "pattern"]), ["command_topic"]),
        "binary_sensor": (common.union(["state_topic", "value_template", "payload_on", "payload_off", "device_class", "expire_after",
                                        "force_update", "off_delay"]), ["state_topic"]),
    ]
}()

@Suite("Home Assistant discovery, on a real Mosquitto broker", .serialized, .enabled(if: Broker.available, "needs Debian's mosquitto (scripts/install-deps unit)"))
struct MQTTDiscoveryTests {
    @Test("One device, an entity per output with the keys Home Assistant documents; a channel removed by a reload loses its entity")
    func discovery() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML())
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        let node = "blecontrol_simulator"
        var configs: [String: String] = [:]
        #expect(eventually { configs = broker.retainedAll("homeassistant/#"); return configs.count == 8 * 2 + 4 + 2 + 1 }, "\(configs.keys.sorted())")
        for (topic, payload) in configs {
            let levels = topic.split(separator: "/").map(String.init)
            #expect(levels.count == 5 && levels[2] == node && levels[4] == "config", "\(topic)")
            guard levels.count == 5, let schema = homeAssistantKeys[levels[1]] else {
                Issue.record("\(topic): not a component the board announces")
                continue
            }
            guard case .object(let members)? = try? JSONValue.parse(Array(payload.utf8)) else {
                Issue.record("\(topic): not a JSON object: \(payload)")
                continue
            }
            let keys = Set(members.map(\.0))
            #expect(keys.subtracting(schema.allowed).isEmpty, "\(topic): keys Home Assistant does not document: \(keys.subtracting(schema.allowed))")
            #expect(schema.required.isSubset(of: keys), "\(topic): missing \(schema.required.subtracting(keys))")
            let fields = Dictionary(members, uniquingKeysWith: { first, _ in first })
            #expect(fields["unique_id"] == .string("\(node)_\(levels[3])"))
            #expect(fields["availability_topic"] == .string("blecontrol/simulator/availability"))
            if case .object(let device)? = fields["device"] {
                #expect(device.contains { $0.0 == "identifiers" && $0.1 == .array([.string(node)]) })
                #expect(device.contains { $0.0 == "sw_version" })
            } else {
                Issue.record("\(topic): no device")
            }
        }
        #expect(configs["homeassistant/number/\(node)/servo_0/config"]?.contains("\"command_topic\":\"blecontrol/simulator/servo/0/set\"") == true)
        #expect(configs["homeassistant/number/\(node)/pwm_5/config"]?.contains("\"max\":1000") == true)
        #expect(configs["homeassistant/text/\(node)/lcd_1/config"]?.contains("\"max\":16") == true)
        #expect(configs["homeassistant/binary_sensor/\(node)/failsafe/config"]?.contains("\"state_topic\":\"blecontrol/simulator/failsafe\"") == true)

        // A reload without channel 7: its two entities are deleted.
        let path = scratchDirectory("blecontrol-mqtt-board") + "/board.yaml"
        let smaller = broker.boardYAML().split(separator: "\n", omittingEmptySubsequences: false).filter { !$0.contains("{ channel: 7,") }.joined(separator: "\n")
        #expect(smaller != broker.boardYAML())
        try smaller.write(toFile: path, atomically: true, encoding: .utf8)
        board.runtime.reload(path: path)
        #expect(eventually { let now = broker.retainedAll("homeassistant/#"); return now.count == configs.count - 2 && now["homeassistant/number/\(node)/pwm_7/config"] == nil },
                "\(broker.retainedAll("homeassistant/#").keys.sorted())")
        board.runtime.stop()

        // A board started from the smaller file finds the old entities
        // (retained from an earlier run) and deletes them too.
        try broker.publish("homeassistant/switch/\(node)/enable_9/config", "{\"command_topic\":\"x\"}", retain: true)
        let again = try RunningBoard(yaml: smaller)
        #expect(eventually { again.mqttState.hasPrefix("connected") }, "\(again.mqttState)")
        #expect(eventually { broker.retainedAll("homeassistant/#")["homeassistant/switch/\(node)/enable_9/config"] == nil })
        #expect(broker.retainedAll("homeassistant/#").count == configs.count - 2)
    }
}

@Suite("MQTT topics: what each message asks for")
struct MQTTTopicTests {
    let topics = MQTTTopics(prefix: "blecontrol", board: "rc-car")

    @Test("Per-output payloads map to the protocol's messages; anything else is refused with a reason")
    func parse() {
        #expect(topics.command(topic: "blecontrol/rc-car/servo/0/set", payload: Array("1000".utf8)) == .message(.servo(channel: 0, value: 1000)))
        #expect(topics.command(topic: "blecontrol/rc-car/pwm/4/set", payload: Array(" 250\n".utf8)) == .message(.pwm(channel: 4, value: 250)))
        #expect(topics.command(topic: "blecontrol/rc-car/switch/1/set", payload: Array("on".utf8)) == .message(.switchValue(index: 1, on: true)))
        #expect(topics.command(topic: "blecontrol/rc-car/enable/2/set", payload: Array("OFF".utf8)) == .message(.enable(channel: 2, on: false)))
        #expect(topics.command(topic: "blecontrol/rc-car/lcd/1/set", payload: Array("Hi".utf8)) == .message(.lcdText(line: 1, text: Array("Hi".utf8))))
        #expect(topics.command(topic: "blecontrol/rc-car/frames", payload: [9, 0]) == .frames([9, 0]))
        #expect(topics.command(topic: "blecontrol/rc-car/servo/0/set", payload: Array("1001".utf8)) == .invalid("\"1001\" is not a value 0…1000"))
        #expect(topics.command(topic: "blecontrol/rc-car/servo/x/set", payload: Array("1".utf8)) == .invalid("x is not a channel number (0…255)"))
        #expect(topics.command(topic: "blecontrol/rc-car/motor/0/set", payload: Array("1".utf8))
                == .invalid("motor is not an output kind (servo, pwm, switch, enable, lcd)"))
        #expect(topics.command(topic: "blecontrol/rc-car/status", payload: []) == .ignored)
    }

    @Test("Board names become one topic level; prefixes without wildcards or empty levels")
    func names() {
        #expect(MQTTConfiguration.topicName("Robot #1/arm") == "Robot__1_arm")
        #expect(MQTTConfiguration.isTopicLevel("site/robots", allowSlash: true))
        #expect(!MQTTConfiguration.isTopicLevel("site//robots", allowSlash: true))
        #expect(!MQTTConfiguration.isTopicLevel("+", allowSlash: true))
        #expect(!MQTTConfiguration.isTopicLevel("/robots", allowSlash: true))
    }
}
