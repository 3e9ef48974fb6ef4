import Foundation
import Testing
import TestSupport

@Suite("Trust nothing another user owns: what a broker hands the CLI is printed escaped", .serialized,
       .enabled(if: MosquittoBroker.available, "needs Debian's mosquitto and libmosquitto1 for this architecture (scripts/install-deps unit)"))
struct BrokerTextTests {
    @Test("fleet and status --mqtt show a board's title, clear-screen and colour sequences, newlines and invalid UTF-8 as visible escapes")
    func escapes() throws {
        let broker = try MosquittoBroker()
        let access = try MQTTFleetTests.access(broker)
        let address = "127.0.0.1:\(broker.port)"
        // A real status, then what a hostile publisher makes of it.
        let daemon = try SimulatorDaemon()
        var status = try daemon.status()
        status["board"] = "evil\u{1b}]0;pwned\u{07}"
        status["version"] = "\u{1b}[2J\u{1b}[H9.9"
        var lcd = status["lcd"] as? [String: Any] ?? [:]
        lcd["lines"] = ["\u{1b}[31mred\u{1b}[0m", "two\nlines"]
        status["lcd"] = lcd
        let json = try JSONSerialization.data(withJSONObject: status)
        try broker.publish("blecontrol/evil/status", [UInt8](json), retain: true)
        try broker.publish("blecontrol/evil/availability", Array("online\u{1b}[5m".utf8) + [0xFF, 0x0A], retain: true)

        let fleet = try run(Executables.cli, ["fleet", "--mqtt", address] + access)
        #expect(fleet.status == 0, "\(fleet.stderr)")
        #expect(fleet.stdout.contains("online\\x1b[5m\\xff\\n"), "\(fleet.stdout)")
        #expect(fleet.stdout.contains("\\x1b[2J\\x1b[H9.9"), "\(fleet.stdout)")

        let shown = try run(Executables.cli, ["status", "--mqtt", "evil@\(address)"] + access)
        #expect(shown.status == 0, "\(shown.stderr)")
        #expect(shown.stdout.contains("board evil\\x1b]0;pwned\\x07"), "\(shown.stdout)")
        #expect(shown.stdout.contains("\\x1b[31mred\\x1b[0m") && shown.stdout.contains("two\\nlines"), "\(shown.stdout)")

        for output in [fleet.stdout, shown.stdout] {
            let controls = output.unicodeScalars.filter { ($0.value < 0x20 && $0 != "\n") || (0x7F...0x9F).contains($0.value) }
            #expect(controls.isEmpty, "control characters printed: \(controls.map { String($0.value, radix: 16) })")
        }
    }
}
