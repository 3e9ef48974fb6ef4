import BLEControlProtocol
import Board
import Control
import Foundation
import Hardware
import Reactor
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

private typealias Broker = MosquittoBroker
private typealias Subscriber = MosquittoSubscriber

private extension MosquittoBroker {
    /// The test board with this broker's `transports.mqtt`.
    func boardYAML(password: String = "board.password", keepalive: Int = 5, caFile: String? = nil) -> String {
        testBoard(silenceMs: 0).replacingOccurrences(of: "transports:\n", with: "transports:\n" + mqttSection(password: password, keepalive: keepalive, caFile: caFile))
    }
}

private extension RunningBoard {
    var mqttState: String { (try? runtime.status().transports.mqtt) ?? "" }
    var mqttSession: StatusReport.SessionInfo? { (try? runtime.status().sessions)?.first { $0.transport == "mqtt" } }
}

private func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

@Suite("The MQTT transport, on a real Mosquitto broker", .serialized, .enabled(if: Broker.available, "needs Debian's mosquitto and libmosquitto1 for this architecture (scripts/install-deps unit)"))
struct MQTTTransportTests {
    @Test("Silence is per commander over TCP and MQTT: a frozen TCP central's channel fails safe while Home Assistant-like commands keep coming")
    func frozenTCPBesideBusyMQTT() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML().replacingOccurrences(of: "silence_timeout_ms: 0 ", with: "silence_timeout_ms: 5000 "))
        #expect(eventually { board.mqttState.hasPrefix("connected to 127.0.0.1:\(broker.port)") }, "\(board.mqttState)")
        let frozen = try board.commander(of: 0)
        // The broker connection commands switch 0, one message after another
        // (each a mosquitto_pub: well within the 5 s), until the failsafe
        // holds for the TCP central. (On a loaded machine the broker may
        // drop the board for a late keepalive: the failsafe then holds for
        // the MQTT central first, and for the TCP one once MQTT is back.)
        var reason: String?
        for round in 0..<2000 where reason?.hasPrefix("central silent: tcp") != true {
            try broker.publish("blecontrol/simulator/switch/0/set", round % 2 == 0 ? "ON" : "OFF")
            reason = try board.servo().failsafe
        }
        #expect(reason?.hasPrefix("central silent: tcp") == true, "\(String(describing: reason))")
        #expect(reason?.hasSuffix("(channel 0)") == true, "\(String(describing: reason))")
        #expect(board.mqttState.hasPrefix("connected"), "the busy commander kept its own outputs and its connection")
        _ = frozen
    }

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
        // The ERROR is the loop's answer; the servo and LCD threads put the
        // frames before it out when they get to them.
        #expect(eventually { abs(board.pulse(3) - 1250) < 5 })
        #expect(eventually { board.runtime.emulators?.lcd?.lcd.lines.first?.hasPrefix("over MQTT") == true })

        // A frame cut at the end of its message is not finished by the next
        // message: discarded, and the next message's frame applies whole.
        try broker.publish("\(base)/frames", [0x02, 0x03, 0x00])
        try broker.publish("\(base)/frames", FrameEncoder.encode(.servo(channel: 0, value: 100)))
        #expect(eventually { abs(board.pulse(0) - 1100) < 5 })

        // A payload a person might mistype: refused with the reason, nothing moves.
        try broker.publish("\(base)/servo/0/set", "fast")
        #expect(eventually { errors.payloads("\(base)/errors").contains(hex(Array("\(base)/servo/0/set: \"fast\" is not a value 0…1000 (or {\"value\": 500, \"transition\": 1.5})".utf8))) },
                "\(errors.lines)")
        try broker.publish("\(base)/servo/9/set", "500")  // no channel 9: ERROR 02, as over BLE
        #expect(eventually { errors.payloads("\(base)/errors").contains("ff0102") }, "\(errors.lines)")
        #expect(abs(board.pulse(0) - 1100) < 5)

        #expect(eventually { broker.retained("\(base)/failsafe") == "OFF" })
        #expect(eventually { broker.retained("\(base)/status")?.contains("\"board\":\"simulator\"") == true })
        let session = try #require(board.mqttSession)
        #expect(session.peer == "127.0.0.1:\(broker.port)")
        board.runtime.stop()
        #expect(eventually { broker.retained("\(base)/availability") == "offline" }, "a clean stop says offline (a clean disconnect sends no will)")
    }

    @Test("Transitions through the broker: a move of two channels in steps, a channel's own transition (retained), a move refused whole")
    func transitions() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML())
        #expect(eventually { board.mqttState.hasPrefix("connected to 127.0.0.1:\(broker.port)") }, "\(board.mqttState)")
        let base = "blecontrol/simulator"
        let errors = try Subscriber(broker, topics: ["\(base)/errors"])
        #expect(eventually { broker.retained("\(base)/transition/0") == "0.0" }, "each servo channel's transition, published at connect")
        try broker.publish("\(base)/frames", FrameEncoder.encode(.enable(channel: 0, on: true)) + FrameEncoder.encode(.enable(channel: 1, on: true))
                           + FrameEncoder.encode(.servo(channel: 0, value: 0)) + FrameEncoder.encode(.servo(channel: 1, value: 0)))
        #expect(eventually { abs(board.pulse(0) - 1000) < 5 && abs(board.pulse(1) - 1000) < 5 })

        // Two channels in one move: both under way in steps (a pulse between
        // the ends), so the transition reached the servo engine. Two minutes
        // long, so that no stall of a busy machine's threads (qemu-user
        // beside two guests: a move of 0.6 s was once seen in one step) ends
        // it before a poll sees it under way; how many steps a real-time
        // thread writes in a given time is the machine's, and the steps'
        // timing is MotionTests' (an injected clock). A plain move then
        // ends it where it was heading.
        try broker.publish("\(base)/move/set", #"{"pulse": {"0": 1800}, "servo": {"1": 400}, "transition": 120}"#)
        #expect(eventually { (1005.0..<1795.0).contains(board.pulse(0)) && (1005.0..<1395.0).contains(board.pulse(1)) },
                "both under way: \(board.pulse(0)), \(board.pulse(1))")
        try broker.publish("\(base)/move/set", #"{"pulse": {"0": 1800}, "servo": {"1": 400}}"#)
        #expect(eventually { abs(board.pulse(0) - 1800) < 5 && abs(board.pulse(1) - 1400) < 5 })
        for (channel, target) in [(0, 1800.0), (1, 1400.0)] {
            let widths = board.chip.history(channel: channel).map(\.pulseWidth.value).filter { $0 > 1005 && $0 <= target + 5 }
            #expect(widths.count >= 2, "channel \(channel) moved in steps: \(widths)")
            #expect(zip(widths, widths.dropFirst()).allSatisfy { $0 < $1 }, "channel \(channel): \(widths)")
        }

        // Channel 1's own transition: its next plain …/set moves in steps;
        // with the transition 0 again, the one after goes at once.
        try broker.publish("\(base)/transition/1/set", "120")
        #expect(eventually { broker.retained("\(base)/transition/1") == "120.0" })
        try broker.publish("\(base)/servo/1/set", "1000")
        #expect(eventually { (1405.0..<1995.0).contains(board.pulse(1)) }, "under way: \(board.pulse(1))")
        try broker.publish("\(base)/transition/1/set", "0")
        #expect(eventually { broker.retained("\(base)/transition/1") == "0.0" })
        try broker.publish("\(base)/servo/1/set", "1000")
        #expect(eventually { abs(board.pulse(1) - 2000) < 5 })
        let steps = board.chip.history(channel: 1).map(\.pulseWidth.value).filter { $0 > 1405 }
        #expect(steps.count >= 2 && zip(steps, steps.dropFirst()).allSatisfy { $0 < $1 }, "\(steps)")

        // A pulse for a PWM channel (5): the whole move refused, nothing
        // moves (a pulse outside a servo's calibration is clamped to it, as
        // on …/pulse/N/set).
        try broker.publish("\(base)/move/set", #"{"pulse": {"0": 1200, "5": 1500}}"#)
        let refusals = { errors.payloads("\(base)/errors").map { String(decoding: ControlProtocol.bytes(fromHex: $0) ?? [], as: UTF8.self) } }
        #expect(eventually { refusals().contains { $0.hasPrefix("\(base)/move/set: ") && $0.hasSuffix("; nothing moved") } }, "\(refusals())")
        #expect(abs(board.pulse(0) - 1800) < 5 && abs(board.pulse(1) - 2000) < 5)
        try broker.publish("\(base)/transition/5/set", "1")
        #expect(eventually { refusals().contains("\(base)/transition/5/set: channel 5 is not a servo or ESC channel of this board") }, "\(refusals())")
    }

    @Test("The original demo app's session through the broker: as raw frames, one a message as the app writes them, and as per-output topics")
    func demoAppSession() throws {
        let broker = try Broker()
        // The simulator board as shipped: PWM on 4-7, as the app has them.
        let board = try RunningBoard(yaml: EmbeddedBoards.simulator.replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection()))
        let base = "blecontrol/simulator"
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        // The app's screen opens: channels 0-7 on; the servo sliders (every
        // value resent as one moves), PWM sliders (a negative one as the
        // app's Int16), the four switches, two LCD lines (docs/protocol.md,
        // "The original demo app").
        var frames: [[UInt8]] = (UInt8(0)...7).map { FrameEncoder.encode(.enable(channel: $0, on: true)) }
        let servos: [UInt16] = [100, 400, 700, 1000]
        for moved in 0..<servos.count {
            for channel in 0...moved { frames.append(FrameEncoder.encode(.servo(channel: UInt8(channel), value: servos[channel]))) }
        }
        for (offset, value) in [Int16(250), 500, 1000, -500].enumerated() {
            frames.append(FrameEncoder.encode(.pwm(channel: UInt8(4 + offset), value: UInt16(bitPattern: value))))
        }
        for (index, on) in [true, false, true, true].enumerated() { frames.append([0x06, 0x02, UInt8(index), on ? 1 : 0]) }
        frames.append([0x04, 0x0C, 0x00] + Array("BLEControl".utf8) + [0x00])
        frames.append([0x04, 0x0A, 0x01] + Array("Demo app".utf8) + [0x00])
        for frame in frames { try broker.publish("\(base)/frames", frame) }
        func applied() -> Bool {
            (0..<4).allSatisfy { abs(board.pulse($0) - 1000 - Double(servos[$0])) < 5 }
                && abs(board.duty(4) - 0.25) < 0.001 && abs(board.duty(5) - 0.5) < 0.001 && board.duty(6) == 1 && board.duty(7) == 1
                && board.runtime.emulators?.lcd?.lcd.lines == ["BLEControl      ", "Demo app        "]
                && (try? board.runtime.status().switches.map(\.on)) == [true, false, true, true]
        }
        #expect(eventually { applied() }, "the demo app's outputs through …/frames")
        #expect(board.mqttSession?.errors == 0)

        // The screen closes; then the same session by hand, topic by topic.
        for channel in 0...7 { try broker.publish("\(base)/enable/\(channel)/set", "OFF") }
        for channel in 0...3 { try broker.publish("\(base)/switch/\(channel)/set", "OFF") }
        try broker.publish("\(base)/lcd/0/set", "")
        try broker.publish("\(base)/lcd/1/set", "")
        #expect(eventually { (0...7).allSatisfy { board.pulse($0) == 0 } && board.runtime.emulators?.lcd?.lcd.lines == ["                ", "                "] })
        for channel in 0...7 { try broker.publish("\(base)/enable/\(channel)/set", "ON") }
        for (channel, value) in servos.enumerated() { try broker.publish("\(base)/servo/\(channel)/set", "\(value)") }
        for (offset, value) in [250, 500, 1000, 1000].enumerated() { try broker.publish("\(base)/pwm/\(4 + offset)/set", "\(value)") }
        for (index, on) in [true, false, true, true].enumerated() { try broker.publish("\(base)/switch/\(index)/set", on ? "ON" : "OFF") }
        try broker.publish("\(base)/lcd/0/set", "BLEControl")
        try broker.publish("\(base)/lcd/1/set", "Demo app")
        #expect(eventually { applied() }, "the demo app's outputs through the per-output topics")
        #expect(board.mqttSession?.errors == 0)
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
        #expect(eventually { (try? board.servo().failsafe)?.hasPrefix("central left: mqtt 127.0.0.1:\(broker.port) (channel") == true })
        try broker.start()
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        try broker.publish("\(base)/servo/0/set", "300")
        #expect(eventually { abs(board.pulse(0) - 1300) < 5 }, "the first live command after the reconnect clears the failsafe")
        #expect(board.pulse(1) == 0 && board.pulse(2) == 0)
        #expect(board.mqttSession?.frames == 1, "a new session: nothing replayed")
    }

    @Test("A broker that goes silent (frozen: the network between lost, no connection reset) is given up after the keepalive: failsafe; then back")
    func silentBroker() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML(keepalive: 5))
        let base = "blecontrol/simulator"
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        try broker.publish("\(base)/enable/0/set", "ON")
        try broker.publish("\(base)/servo/0/set", "800")
        #expect(eventually { abs(board.pulse(0) - 1800) < 5 })
        broker.freeze()
        defer { broker.thaw() }
        // No packet comes back: libmosquitto gives the broker up one
        // keepalive after its unanswered ping.
        #expect(eventually { (try? board.servo().failsafe)?.hasPrefix("central left: mqtt") == true })
        #expect(board.mqttState.contains("retrying in"), "\(board.mqttState)")
        broker.thaw()
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        #expect(try board.servo().failsafe != nil, "back on the broker, the failsafe holds until a command arrives")
    }

    @Test("TLS: the board connects to a broker whose certificate chains to ca_file, and with a client certificate where one is wanted; says why when it cannot")
    func tls() throws {
        let broker = try Broker(tls: true)
        let board = try RunningBoard(yaml: broker.boardYAML(caFile: "\(broker.directory)/ca.crt"))
        #expect(eventually { board.mqttState.hasPrefix("connected to 127.0.0.1:\(broker.tlsPort ?? 0)") }, "\(board.mqttState)")
        try broker.publish("blecontrol/simulator/enable/0/set", "ON")
        try broker.publish("blecontrol/simulator/servo/0/set", "400")
        #expect(eventually { abs(board.pulse(0) - 1400) < 5 }, "a command reaches the board over TLS")

        // A client certificate instead of a password, where the broker wants one.
        let certified = try RunningBoard(yaml: testBoard(silenceMs: 0).replacingOccurrences(of: "name: simulator", with: "name: certified")
            .replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection(clientCertificate: true)))
        #expect(eventually { certified.mqttState.hasPrefix("connected to 127.0.0.1:\(broker.certificatePort ?? 0)") }, "\(certified.mqttState)")
        try broker.publish("blecontrol/certified/enable/1/set", "ON")
        try broker.publish("blecontrol/certified/servo/1/set", "600")
        #expect(eventually { abs(certified.pulse(1) - 1600) < 5 }, "a command reaches the board that showed its certificate")
        let uncertified = try RunningBoard(yaml: testBoard(silenceMs: 0).replacingOccurrences(of: "name: simulator", with: "name: uncertified")
            .replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection(clientCertificate: true)
                .replacingOccurrences(of: "    cert_file: \(broker.directory)/client.crt\n    key_file: \(broker.directory)/client.key\n", with: "")))
        #expect(eventually { uncertified.mqttState.contains("retrying in") }, "\(uncertified.mqttState)")

        let untrusting = try RunningBoard(yaml: broker.boardYAML(caFile: "\(broker.directory)/other-ca.crt").replacingOccurrences(of: "name: simulator", with: "name: other"))
        #expect(eventually { untrusting.mqttState.contains("retrying in") }, "\(untrusting.mqttState)")
        #expect(try untrusting.runtime.status().sessions.allSatisfy { $0.transport != "mqtt" })
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
        // Its neutral pulse for the 150 ms dwell, then none: in the chip's
        // history (a poll under qemu-user beside two guests missed it).
        #expect(eventually { board.ended(4, with: [1700, 1000, 0]) }, "the ESC at its failsafe pulse, then off: \(board.pulses(4))")
        #expect(eventually { board.mqttState.contains("retrying in") }, "\(board.mqttState)")
        try broker.start()
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
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
                               "payload_available", "payload_not_available", "qos", "encoding", "json_attributes_topic", "json_attributes_template",
                               "default_entity_id", "origin"]
    return [
        "number": (common.union(["command_topic", "command_template", "state_topic", "value_template", "min", "max", "step", "mode",
                                 "optimistic", "retain", "unit_of_measurement", "device_class", "payload_reset"]), ["command_topic"]),
        "switch": (common.union(["command_topic", "state_topic", "value_template", "payload_on", "payload_off", "state_on", "state_off",
                                 "optimistic", "retain", "device_class"]), ["command_topic"]),
        "text": (common.union(["command_topic", "command_template", "state_topic", "value_template", "min", "max", "mode", "pattern"]), ["command_topic"]),
        "binary_sensor": (common.union(["state_topic", "value_template", "payload_on", "payload_off", "device_class", "expire_after",
                                        "force_update", "off_delay"]), ["state_topic"]),
        "sensor": (common.union(["state_topic", "value_template", "unit_of_measurement", "device_class", "state_class", "expire_after",
                                 "force_update", "last_reset_value_template", "suggested_display_precision", "options"]), ["state_topic"]),
    ]
}()

@Suite("Home Assistant discovery, on a real Mosquitto broker", .serialized, .enabled(if: Broker.available, "needs Debian's mosquitto and libmosquitto1 for this architecture (scripts/install-deps unit)"))
struct MQTTDiscoveryTests {
    @Test("One device, an entity per output with the keys Home Assistant documents; a channel removed by a reload loses its entity")
    func discovery() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML())
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        let node = "blecontrol_simulator"
        var configs: [String: String] = [:]
        #expect(eventually { configs = broker.retainedAll("homeassistant/#"); return configs.count == 8 * 2 + 5 * 2 + 4 + 2 + 1 }, "\(configs.keys.sorted())")
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
        #expect(configs["homeassistant/number/\(node)/servo_0/config"]?.contains("\"command_topic\":\"blecontrol/simulator/pulse/0/set\"") == true)
        #expect(configs["homeassistant/number/\(node)/servo_0/config"]?.contains("\"unit_of_measurement\":\"\u{03BC}s\"") == true)
        #expect(configs["homeassistant/number/\(node)/pwm_5/config"]?.contains("\"max\":100") == true)
        #expect(configs["homeassistant/number/\(node)/pwm_5/config"]?.contains("\"unit_of_measurement\":\"%\"") == true)
        #expect(configs["homeassistant/switch/\(node)/enable_5/config"]?.contains("\"entity_category\":\"config\"") == true)
        #expect(configs["homeassistant/text/\(node)/lcd_1/config"]?.contains("\"max\":16") == true)
        #expect(configs["homeassistant/binary_sensor/\(node)/failsafe/config"]?.contains("\"state_topic\":\"blecontrol/simulator/failsafe\"") == true)
        #expect(configs["homeassistant/sensor/\(node)/position_0/config"]?.contains("\"state_class\":\"measurement\"") == true)
        #expect(configs["homeassistant/number/\(node)/transition_4/config"]?.contains("\"state_topic\":\"blecontrol/simulator/transition/4\"") == true)
        #expect(configs["homeassistant/number/\(node)/transition_5/config"] == nil, "PWM channels have no transition")

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
                == .invalid("motor is not an output kind (servo, pulse, pwm, switch, enable, lcd, transition)"))
        #expect(topics.command(topic: "blecontrol/rc-car/pulse/3/set", payload: Array("1500.0".utf8)) == .pulse(channel: 3, microseconds: 1500))
        #expect(topics.command(topic: "blecontrol/rc-car/pulse/3/set", payload: Array("fast".utf8)) == .invalid("\"fast\" is not a pulse in µs (such as 1500, or {\"value\": 1500, \"transition\": 1.5})"))
        #expect(topics.command(topic: "blecontrol/rc-car/status", payload: []) == .ignored)
    }

    @Test("Transitions: a value with one, a channel's own, and a move of several outputs together")
    func transitions() {
        #expect(topics.command(topic: "blecontrol/rc-car/pulse/0/set", payload: Array(#"{"value": 1800, "transition": 1.5}"#.utf8))
                == .pulse(channel: 0, microseconds: 1800, over: .milliseconds(1500)))
        #expect(topics.command(topic: "blecontrol/rc-car/servo/1/set", payload: Array(#"{"value": 250}"#.utf8)) == .message(.servo(channel: 1, value: 250)))
        #expect(topics.command(topic: "blecontrol/rc-car/servo/1/set", payload: Array(#"{"value": 250, "transition": 0}"#.utf8)) == .message(.servo(channel: 1, value: 250)))
        #expect(topics.command(topic: "blecontrol/rc-car/pwm/4/set", payload: Array(#"{"value": 250, "transition": 601}"#.utf8))
                == .invalid(#""{"value": 250, "transition": 601…" is not a value 0…1000 (or {"value": 500, "transition": 1.5})"#))
        #expect(topics.command(topic: "blecontrol/rc-car/transition/2/set", payload: Array("2.5".utf8)) == .transition(channel: 2, .milliseconds(2500)))
        #expect(topics.command(topic: "blecontrol/rc-car/transition/2/set", payload: Array("-1".utf8)) == .invalid("\"-1\" is not a transition in seconds (0…600)"))
        #expect(topics.command(topic: "blecontrol/rc-car/move/set", payload: Array(#"{"pulse": {"0": 1200, "1": 1800}, "servo": {"2": 100}, "transition": 2}"#.utf8))
                == .move(pulses: [.init(channel: 0, microseconds: 1200), .init(channel: 1, microseconds: 1800)], messages: [.servo(channel: 2, value: 100)], over: .seconds(2)))
        #expect(topics.command(topic: "blecontrol/rc-car/move/set", payload: Array(#"{"servo": {"2": 1001}}"#.utf8)) == .invalid("servo 2: 1001 is not a value 0…1000"))
        #expect(topics.command(topic: "blecontrol/rc-car/move/set", payload: Array(#"{"transition": 1}"#.utf8)) == .invalid("a move names no output"))
        #expect(topics.command(topic: "blecontrol/rc-car/move/set", payload: Array(#"{"lcd": {"0": 1}}"#.utf8)) == .invalid("lcd is not part of a move (pulse, servo, pwm, transition)"))
        #expect(topics.command(topic: "blecontrol/rc-car/move/set", payload: Array("[1]".utf8))
                == .invalid(#"a move is a JSON object: {"pulse": {"0": 1500}, "servo": {…}, "pwm": {…}, "transition": 1.5}"#))
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

@Suite("A pulse in µs back to the SERVO_VAL that gives it")
struct PulseToValueTests {
    @Test("Every value survives the round trip through its pulse, calibrated and inverted alike; pulses beyond the range clamp")
    func roundTrip() throws {
        let yaml = """
        name: t
        buses: { main: { emulated: true } }
        servo:
          bus: main
          channels:
            - { channel: 0, output: 0, role: servo }
            - { channel: 1, output: 1, role: servo, min_us: 600, center_us: 1480, max_us: 2400 }
            - { channel: 2, output: 2, role: esc, min_us: 1100, max_us: 1900, invert: true }
        """
        let channels = try #require(try BoardFile.parse(yaml, path: "t.yaml").servo?.channels)
        for channel in channels {
            for value in stride(from: UInt16(0), through: 1000, by: 1) {
                guard case .pulse(let width) = channel.output(forServoValue: value) else {
                    Issue.record("channel \(channel.channel) gave no pulse")
                    continue
                }
                #expect(channel.servoValue(forPulse: width) == value, "channel \(channel.channel), value \(value), \(width.value) µs")
            }
        }
        #expect(channels[1].servoValue(forPulse: Microseconds(100)) == 0)
        #expect(channels[1].servoValue(forPulse: Microseconds(5000)) == 1000)
        #expect(channels[2].servoValue(forPulse: Microseconds(1900)) == 0, "inverted: the top of the range is SERVO_VAL 0")
    }

    @Test("Over MQTT: …/pulse/N/set moves a calibrated servo to that pulse; a PWM channel refuses it")
    func overMQTT() throws {
        let broker = try Broker()
        let board = try RunningBoard(yaml: broker.boardYAML().replacingOccurrences(of: "{ channel: 1, output: 1, role: servo, min_us: 1000, max_us: 2000 }",
                                                                                   with: "{ channel: 1, output: 1, role: servo, min_us: 600, center_us: 1480, max_us: 2400, invert: true }"))
        #expect(eventually { board.mqttState.hasPrefix("connected") }, "\(board.mqttState)")
        let errors = try Subscriber(broker, topics: ["blecontrol/simulator/errors"])
        try broker.publish("blecontrol/simulator/enable/1/set", "ON")
        try broker.publish("blecontrol/simulator/pulse/1/set", "2100")
        // One SERVO_VAL step is 1.84 µs of this calibration.
        #expect(eventually { abs(board.pulse(1) - 2100) < 2 }, "\(board.pulse(1))")
        #expect(eventually { abs(((try? board.runtime.status().channels.first { $0.channel == 1 }?.setpointUs) ?? 0) - 2100) < 2 })
        try broker.publish("blecontrol/simulator/pulse/5/set", "1500")
        #expect(eventually { errors.payloads("blecontrol/simulator/errors").contains(hex(Array("blecontrol/simulator/pulse/5/set: channel 5 is a PWM channel: it takes a duty, not a pulse (…/pwm/5/set)".utf8))) },
                "\(errors.lines)")
    }
}
