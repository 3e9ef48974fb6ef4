import BLEControlProtocol
import Foundation
import Testing

/// The Python rigs (Tests/BLE, Tests/VM, Tests/Web) encode frames with
/// scripts/lib/rig/board.py; it checks itself against this same table
/// (`python3 scripts/lib/rig/board.py`, in scripts/test's unit tier), so the
/// rigs and the firmware agree on every frame they send.
@Suite("The rigs' frame table")
struct RigFrameTableTests {
    @Test("FrameEncoder produces every frame of Fixtures/frames.json")
    func sharedTable() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/frames.json")
        let rows = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [[String: Any]])
        #expect(rows.count >= 7)
        for row in rows {
            let channel = (row["channel"] as? Int).map(UInt8.init) ?? 0
            let message: Message
            switch row["message"] as? String {
            case "init": message = .initialize
            case "enable": message = .enable(channel: channel, on: row["on"] as? Bool ?? false)
            case "servo": message = .servo(channel: channel, value: UInt16(row["value"] as? Int ?? 0))
            case "pwm": message = .pwm(channel: channel, value: UInt16(row["value"] as? Int ?? 0))
            case "lcd_text": message = .lcdText(line: UInt8(row["line"] as? Int ?? 0), text: Array((row["text"] as? String ?? "").utf8))
            case "lcd_clear": message = .lcdClear
            case "switch": message = .switchValue(index: UInt8(row["index"] as? Int ?? 0), on: row["on"] as? Bool ?? false)
            default:
                Issue.record("unknown message in frames.json: \(row)")
                continue
            }
            let hex = FrameEncoder.encode(message).map { String(format: "%02x", $0) }.joined()
            #expect(hex == row["hex"] as? String, "\(row)")
        }
    }
}
