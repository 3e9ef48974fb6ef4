import Foundation
import Testing

@testable import Board

/// blecontrol-board(5) documents every key the board-file parser accepts,
/// and nothing more: the page's `.TP` / `.B key.path` entries against the
/// mappings the parser reads while it takes files that use every section.
struct BoardManualTests {
    /// Every key path the parser allowed while reading `texts`, and the
    /// schema lines that asked for a mapping.
    static func acceptedKeys(_ texts: [String]) throws -> (keys: Set<String>, sites: Set<UInt>) {
        var keys: Set<String> = []
        var sites: Set<UInt> = []
        for text in texts {
            let reader = BoardReader(path: "fixture.yaml")
            reader.schemaTrace = []
            let root = try #require(try YAML.parse(text))
            _ = reader.board(root)
            #expect(reader.problems.isEmpty, "fixture refused: \(reader.problems)")
            for (field, allowed, site) in reader.schemaTrace ?? [] {
                // servo.chips[1] → servo.chips[]; buses.main → buses.NAME.
                var general = field.replacingOccurrences(of: #"\[[0-9]+\]"#, with: "[]", options: .regularExpression)
                if general.hasPrefix("buses.") { general = "buses.NAME" }
                if general == "buses.NAME" { keys.insert(general) }
                for key in allowed { keys.insert(general.isEmpty ? key : "\(general).\(key)") }
                sites.insert(site)
            }
        }
        return (keys, sites)
    }

    @Test("every key the board-file parser accepts is in blecontrol-board(5), and nothing more")
    func manualMatchesSchema() throws {
        let simulator = try String(contentsOf: repositoryRoot.appendingPathComponent("board/simulator.yaml"), encoding: .utf8)
        let hexapod = try String(contentsOf: repositoryRoot.appendingPathComponent("board/hexapod.yaml"), encoding: .utf8)
        // The sections no shipped board file uses: an HM-10 on a UART, MQTT.
        let withSerial = simulator.replacingOccurrences(of: "transports:\n  tcp:",
                                                        with: "transports:\n  serial:\n    device: /dev/ttyS0\n  mqtt:\n    broker: mqtt.local\n  tcp:")
        #expect(withSerial != simulator)
        let (accepted, sites) = try Self.acceptedKeys([withSerial, hexapod])

        // The fixtures reach every mapping the schema reads: each line of
        // BoardSchema.swift that calls mapping(…) was visited.
        let schema = try String(contentsOf: repositoryRoot.appendingPathComponent("Sources/Board/BoardSchema.swift"), encoding: .utf8)
        var callSites: Set<UInt> = []
        for (number, line) in schema.split(separator: "\n", omittingEmptySubsequences: false).enumerated() where line.range(of: #"(^|[^.\w])mapping\("#, options: .regularExpression) != nil {
            callSites.insert(UInt(number + 1))
        }
        #expect(!callSites.isEmpty)
        #expect(callSites.subtracting(sites).isEmpty, "schema lines no fixture reaches: \(callSites.subtracting(sites).sorted())")

        let page = try String(contentsOf: repositoryRoot.appendingPathComponent("docs/man/blecontrol-board.5"), encoding: .utf8)
        let lines = page.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        var documented: [String] = []
        for (index, line) in lines.enumerated() where line == ".TP" && index + 1 < lines.count && lines[index + 1].hasPrefix(".B ") {
            documented.append(String(lines[index + 1].dropFirst(3)).trimmingCharacters(in: .whitespaces))
        }
        #expect(Set(documented).count == documented.count, "documented twice: \(documented.filter { key in documented.filter { $0 == key }.count > 1 })")
        let missing = accepted.subtracting(documented).sorted()
        let extra = Set(documented).subtracting(accepted).sorted()
        #expect(missing.isEmpty, "accepted by the parser, not in blecontrol-board(5): \(missing)")
        #expect(extra.isEmpty, "in blecontrol-board(5), not accepted by the parser: \(extra)")
    }
}
