import Control
import Testing

@Suite("The control protocol's JSON")
struct ControlTests {
    static let sample = StatusReport(
        board: "simulator", version: "0.2.0", uptimeSeconds: 1.5, simulated: true,
        channels: [StatusReport.Channel(channel: 0, output: 0, role: "servo", enabled: true, command: "servo", value: 500, pulseUs: 1500, duty: 0.075, latched: false)],
        switches: [StatusReport.Switch(switch: 0, on: true, output: "emulated")],
        servo: nil,
        lcd: StatusReport.LCD(online: true, error: nil, columns: 16, rows: 2, lines: ["Hi \"there\"", "°\\"], overlay: "failsafe", busWrites: 3),
        led: StatusReport.LED(pattern: "heartbeat", lit: true),
        sessions: [], counters: StatusReport.Counters(frames: 1, errors: 0, discardedPartials: 0, sessionsTotal: 1),
        transports: StatusReport.Transports(tcp: "127.0.0.1:7171", control: "/tmp/x.sock")
    )

    @Test("A status report round-trips, with snake_case keys in CodingKeys order and no nil keys")
    func statusRoundTrip() throws {
        let bytes = try JSONEncoderLite().encode(Self.sample)
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(text.hasPrefix("{\"board\":\"simulator\",\"version\":\"0.2.0\",\"uptime_seconds\":1.5,"))
        #expect(text.contains("\"pulse_us\":1500"))
        #expect(text.contains("\"discarded_partials\":0"))
        #expect(!text.contains("\"servo\":"), "a nil servo section is left out")
        #expect(!text.contains("\"error\":"), "nil errors are left out")
        #expect(text.contains("\"Hi \\\"there\\\"\""))
        let decoded = try JSONDecoderLite().decode(StatusReport.self, from: bytes)
        #expect(decoded == Self.sample)
        let pretty = try JSONEncoderLite(pretty: true).encode(Self.sample)
        #expect(try JSONDecoderLite().decode(StatusReport.self, from: pretty) == Self.sample)
    }

    @Test("Requests: known operations decode, unknown ones say which exist")
    func requests() throws {
        #expect(try ControlProtocol.request(from: Array(#"{"op":"send","hex":"0203"}"#.utf8)).op == .send)
        #expect(try ControlProtocol.request(from: Array(#"{"op":"poll"}"#.utf8)).op == .poll)
        #expect(throws: (any Error).self) { try ControlProtocol.request(from: Array(#"{"op":"reboot"}"#.utf8)) }
        do {
            _ = try ControlProtocol.request(from: Array(#"{"op":"reboot"}"#.utf8))
        } catch {
            #expect("\(error)".contains("status, poll, send"))
        }
        #expect(throws: (any Error).self) { try ControlProtocol.request(from: Array("garbage".utf8)) }
    }

    @Test("Parsing is bounded: deep nesting is an error, not a crash")
    func depthLimit() {
        let deep = String(repeating: "[", count: 20_000) + String(repeating: "]", count: 20_000)
        #expect(throws: (any Error).self) { try JSONValue.parse(Array(deep.utf8)) }
        #expect(throws: (any Error).self) { try JSONValue.parse(Array("{\"a\":".utf8)) }
        #expect((try? JSONValue.parse(Array(" [1, -2.5e3, true, null, \"\\u00e9\\ud83d\\ude00\"] ".utf8))) == .array([.number("1"), .number("-2.5e3"), .bool(true), .null, .string("é😀")]))
    }

    @Test("Hex: separators and 0x prefixes are ignored, odd digits refused")
    func hex() {
        #expect(ControlProtocol.bytes(fromHex: "02 03 00:01,0xf4") == [0x02, 0x03, 0x00, 0x01, 0xF4])
        #expect(ControlProtocol.bytes(fromHex: "0x020x03") == [0x02, 0x03])
        #expect(ControlProtocol.bytes(fromHex: "123") == nil)
        #expect(ControlProtocol.bytes(fromHex: "zz") == nil)
        #expect(ControlProtocol.hex([0xFF, 0x01, 0x09]) == "ff0109")
    }

    @Test("--json escapes DEL and the C1 controls as well as C0")
    func jsonControls() throws {
        var report = ControlTests.sample
        report.board = "a\u{1b}[2J\u{7f}\u{9b}b"
        let text = String(decoding: try JSONEncoderLite().encode(report), as: UTF8.self)
        #expect(text.contains(#""board":"a\u001b[2J\u007f\u009bb""#), "\(text)")
        #expect(try JSONDecoderLite().decode(StatusReport.self, from: Array(text.utf8)).board == report.board)
    }
}
