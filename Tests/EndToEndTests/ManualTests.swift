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

    @Test("Help that answers: blecontrold --help shows run's options, a bad option names its own command's help, examples come first")
    func helpThatAnswers() throws {
        let daemonHelp = try run(Executables.daemon, ["--help"])
        #expect(daemonHelp.status == 0)
        #expect(daemonHelp.stdout.contains("--board <FILE>") && daemonHelp.stdout.contains("--check-board"), "\(daemonHelp.stdout)")
        let misspelt = try run(Executables.daemon, ["--bord", "x.yaml"])
        #expect(misspelt.status == 2 && misspelt.stderr.contains("unknown option --bord"), "\(misspelt.stderr)")
        #expect(misspelt.stderr.contains("`blecontrold --help`"), "run's options are in blecontrold --help: \(misspelt.stderr)")
        let status = try run(Executables.cli, ["status", "--jsn"])
        #expect(status.status == 2 && status.stderr.contains("`blecontrol status --help`"), "\(status.stderr)")
        let servo = try run(Executables.cli, ["servo", "0", "--bogus", "1"])
        #expect(servo.stderr.contains("`blecontrol servo --help`"), "\(servo.stderr)")
        // What it does, an example, then the arguments; --raw before the
        // transport options.
        let servoHelp = try run(Executables.cli, ["servo", "--help"]).stdout
        let order = ["SERVO_VAL", "blecontrol servo 0 500", "usage:", "<value>", "  --raw", "  --socket <", "  --ble <", "  --mqtt <"]
        let positions = order.map { servoHelp.range(of: $0)?.lowerBound }
        #expect(!positions.contains(nil), "\(servoHelp)")
        #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted(), "in the order \(order): \(servoHelp)")
    }
}
