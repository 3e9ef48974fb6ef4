import Foundation
import Testing

/// Under systemd a refused board file must reach the journal at error
/// priority (`journalctl -u blecontrold -p err`), not as an info line: the
/// daemon prefixes each line with `<3>` when its stderr is the journal's
/// stream ($JOURNAL_STREAM names that stream's device and inode).
struct JournalPriorityTests {
    @Test("a refused board file: every line <3> when stderr is the journal stream, plain on a terminal or pipe")
    func refusedBoardAtErrorPriority() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-journal-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let board = directory.appendingPathComponent("board.yaml")
        try "name: x\nbuses:\n  main: { emulated: true }\nservo:\n  address: [\n".write(to: board, atomically: true, encoding: .utf8)

        for asJournal in [true, false] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: Executables.daemon)
            process.arguments = ["--board", board.path, "--check-board"]
            let err = Pipe()
            process.standardError = err
            process.standardOutput = FileHandle.nullDevice
            var environment = ProcessInfo.processInfo.environment
            if asJournal {
                // Both ends of a pipe are one inode: the child's stderr is this stream.
                var info = stat()
                #expect(fstat(err.fileHandleForReading.fileDescriptor, &info) == 0)
                environment["JOURNAL_STREAM"] = "\(info.st_dev):\(info.st_ino)"
            } else {
                environment["JOURNAL_STREAM"] = nil
            }
            process.environment = environment
            try process.run()
            let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(process.terminationStatus == 2)
            let lines = text.split(separator: "\n")
            #expect(!lines.isEmpty)
            #expect(lines.contains { $0.contains("board.yaml:") })
            if asJournal {
                #expect(lines.allSatisfy { $0.hasPrefix("<3>") }, "\(text)")
            } else {
                #expect(!text.contains("<3>"), "\(text)")
            }
        }
    }
}
