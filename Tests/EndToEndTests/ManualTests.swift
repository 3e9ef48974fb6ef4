import Foundation
import Testing

/// The manual pages and the completion script the package installs are
/// what the programs make from their own command trees: regenerate them
/// with scripts/make-docs when a command or option changes.
struct ManualTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test("docs/man/blecontrol.1, docs/man/blecontrold.8 and completion/blecontrol are what the programs print",
          arguments: [
              (Executables.cli, ["--manual-page"], "docs/man/blecontrol.1"),
              (Executables.daemon, ["--manual-page"], "docs/man/blecontrold.8"),
              (Executables.cli, ["completion", "bash"], "completion/blecontrol"),
          ])
    func committedFilesMatch(program: String, arguments: [String], file: String) throws {
        let printed = try run(program, arguments)
        #expect(printed.status == 0)
        let committed = try String(contentsOf: Self.root.appendingPathComponent(file), encoding: .utf8)
        #expect(printed.stdout == committed, "\(file) is out of date: run scripts/make-docs")
    }

    @Test("--control-socket is the daemon's older name for --socket")
    func socketAlias() throws {
        let daemon = try run(Executables.daemon, ["--control-socket", "/tmp/x.sock", "--check-board"])
        #expect(daemon.status == 0)
        let unknown = try run(Executables.daemon, ["--no-such-option"])
        #expect(unknown.status == 2)
    }

    @Test("options may come before the command: blecontrol --socket PATH status")
    func optionsBeforeCommand() throws {
        let result = try run(Executables.cli, ["--socket", "/nonexistent/control.sock", "status"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("/nonexistent/control.sock"))
    }
}
