import Foundation
import Testing
import TestSupport
@testable import Firmware
@testable import Runtime

#if canImport(Glibc)
import Glibc
#endif

/// `blecontrol` as uid 65534 (setpriv), the test being root: another local
/// user who may use the control socket (a member of group blecontrol).
private enum Nobody {
    static let cli = ProcessInfo.processInfo.environment["BLECONTROL_BIN"] ?? ""

    static var available: Bool {
        getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") && FileManager.default.isExecutableFile(atPath: cli)
            && ((try? run(["--version"]).status) ?? 1) == 0
    }

    static func run(_ arguments: [String], asRoot: Bool = false) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: asRoot ? cli : "/usr/bin/setpriv")
        process.arguments = asRoot ? arguments : ["--reuid=65534", "--regid=65534", "--clear-groups", cli] + arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output)
    }
}

@Suite("Secrets stay secret: the pairing passkey and the bonds", .serialized,
       .enabled(if: Nobody.available && MosquittoBroker.available, "needs root, setpriv, BLECONTROL_BIN readable by uid 65534, and Mosquitto"))
struct SecretsTests {
    @Test("While a passkey shows: root's status has it; another user's and the broker's retained status have asterisks; forget-bonds is root's alone")
    func passkeyAndBonds() throws {
        let broker = try MosquittoBroker()
        let board = try RunningBoard(yaml: testBoard().replacingOccurrences(of: "transports:\n", with: "transports:\n" + broker.mqttSection()))
        #expect(eventually { broker.retained("blecontrol/simulator/availability") == "online" })
        // The socket is the group's (0660); this stands in for a member of it.
        chmod(board.socket, 0o666)
        chmod(URL(fileURLWithPath: board.socket).deletingLastPathComponent().path, 0o755)

        // bluetoothd's agent call, as the BLE transport hands it on.
        let runtime = board.runtime
        try runtime.loop.submitAndWait { runtime.ble.onPasskey?("042137") }
        #expect(eventually { board.runtime.emulators?.lcd?.lcd.lines.last?.hasPrefix("PIN 042137") == true }, "the LCD shows it: that is its purpose")

        let root = try Nobody.run(["status", "--json", "--socket", board.socket], asRoot: true)
        #expect(root.status == 0 && root.output.contains("PIN 042137"), "\(root.output)")
        let other = try Nobody.run(["status", "--json", "--socket", board.socket])
        #expect(other.status == 0, "\(other.output)")
        #expect(!other.output.contains("042137") && other.output.contains("PIN ******"), "\(other.output)")
        #expect(eventually { broker.retained("blecontrol/simulator/status")?.contains("PIN ******") == true })
        #expect(broker.retained("blecontrol/simulator/status")?.contains("042137") == false)

        let forget = try Nobody.run(["forget-bonds", "--socket", board.socket])
        #expect(forget.status != 0 && forget.output.contains("run it as root"), "\(forget.output)")
        let rootForget = try Nobody.run(["forget-bonds", "--socket", board.socket], asRoot: true)
        #expect(!rootForget.output.contains("run it as root"), "root is not refused: \(rootForget.output)")
    }
}
