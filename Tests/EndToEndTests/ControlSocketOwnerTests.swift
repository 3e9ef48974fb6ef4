import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Another local user: `nobody`, reached with setpriv(1) from a test run as
/// root (CI runs the end-to-end tests as root).
enum OtherUser {
    static let uid: uid_t = 65534

    /// Root, setpriv, and the built programs within reach of uid 65534.
    static var available: Bool {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else { return false }
        return (try? run(as: uid, [Executables.cli, "--version"]).status) == 0
    }
}

/// `arguments` run through env(1) with BLECONTROL_SOCKET unset and
/// `environment` set (an empty value unsets the variable); as `user` (its
/// group, no others) through setpriv(1) when given.
func run(as user: uid_t?, _ arguments: [String], environment: [String: String] = [:]) throws -> Finished {
    let assignments = ["-u", "BLECONTROL_SOCKET"] + environment.sorted { $0.key < $1.key }.flatMap { $0.value.isEmpty ? ["-u", $0.key] : ["\($0.key)=\($0.value)"] }
    let setpriv = user.map { ["/usr/bin/setpriv", "--reuid=\($0)", "--regid=\($0)", "--clear-groups"] } ?? []
    let command = setpriv + ["/usr/bin/env"] + assignments + arguments
    return try run(command[0], Array(command.dropFirst()))
}

@Suite("Trust nothing another user owns: the control socket", .serialized,
       .enabled(if: OtherUser.available, "needs root, setpriv and the built programs readable by uid 65534"))
struct ControlSocketOwnerTests {
    @Test("A daemon of another user: refused by its socket file's owner, then by SO_PEERCRED, before any frame is sent; the caller's own and root's are used")
    func otherUsersDaemon() throws {
        let theirs = try SimulatorDaemon(user: OtherUser.uid)
        // The socket file is uid 65534's: refused before connecting.
        let byFile = try theirs.cli(["enable", "0", "on"])
        #expect(byFile.status == 1, "\(byFile.stdout)")
        #expect(byFile.stderr.contains("refusing the control socket \(theirs.socketPath): the socket file belongs to nobody (uid 65534)"), "\(byFile.stderr)")

        // Its own user's CLI uses it.
        let own = try run(as: OtherUser.uid, [Executables.cli, "enable", "0", "on", "--socket", theirs.socketPath])
        #expect(own.status == 0, "\(own.stdout) \(own.stderr)")

        // The file handed to root: the process behind it is still uid 65534's.
        #expect(chown(theirs.socketPath, 0, 0) == 0)
        let byPeer = try theirs.cli(["enable", "1", "on"])
        #expect(byPeer.status == 1, "\(byPeer.stdout)")
        #expect(byPeer.stderr.contains("the process serving it runs as nobody (uid 65534)"), "\(byPeer.stderr)")

        // The refused commands never reached the board: only its own user's did.
        let status = try theirs.rawStatus()
        #expect((status["counters"] as? [String: Any])?["frames"] as? Int == 1, "\(status["counters"] ?? "")")
        #expect(status.channel(0)?["enabled"] as? Bool == true)
        #expect(status.channel(1)?["enabled"] as? Bool == false)
    }

    @Test("Root's daemon is used by another user's CLI")
    func rootsDaemon() throws {
        let root = try SimulatorDaemon()
        chmod(root.socketPath, 0o666)
        let status = try run(as: OtherUser.uid, [Executables.cli, "status", "--socket", root.socketPath])
        #expect(status.status == 0 && status.stdout.contains("board simulator"), "\(status.stdout) \(status.stderr)")
    }

    @Test("The simulator's socket is in $XDG_RUNTIME_DIR, where blecontrol finds it with no --socket")
    func runtimeDirectory() throws {
        guard !FileManager.default.fileExists(atPath: "/run/blecontrol/control.sock") else { return }
        let runtime = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-xdg-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: runtime) }
        let daemon = try SimulatorDaemon(environment: ["XDG_RUNTIME_DIR": runtime], defaultSocket: runtime + "/blecontrol-simulator.sock")
        _ = daemon
        let status = try run(as: nil, [Executables.cli, "status"], environment: ["XDG_RUNTIME_DIR": runtime])
        #expect(status.status == 0 && status.stdout.contains("board simulator"), "\(status.stdout) \(status.stderr)")
    }

    @Test("Without $XDG_RUNTIME_DIR: /tmp/blecontrol-UID, made with mode 0700; one of another user's is refused and the daemon does not start")
    func fallbackDirectory() throws {
        guard !FileManager.default.fileExists(atPath: "/run/blecontrol/control.sock") else { return }
        let directory = "/tmp/blecontrol-\(OtherUser.uid)"
        try? FileManager.default.removeItem(atPath: directory)
        defer { try? FileManager.default.removeItem(atPath: directory) }

        // Taken first by someone else (root here): uid 65534's daemon refuses it.
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o777])
        let refused = try run(as: OtherUser.uid, [Executables.daemon, "--tcp", "127.0.0.1:0"], environment: ["XDG_RUNTIME_DIR": ""])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("\(directory) belongs to root (uid 0), not nobody (uid 65534)"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: directory + "/simulator.sock"))
        try FileManager.default.removeItem(atPath: directory)

        let daemon = try SimulatorDaemon(environment: ["XDG_RUNTIME_DIR": ""], user: OtherUser.uid, defaultSocket: directory + "/simulator.sock")
        _ = daemon
        let made = try FileManager.default.attributesOfItem(atPath: directory)
        #expect(made[.posixPermissions] as? Int == 0o700 && made[.ownerAccountID] as? Int == Int(OtherUser.uid), "\(made)")
        let status = try run(as: OtherUser.uid, [Executables.cli, "status"], environment: ["XDG_RUNTIME_DIR": ""])
        #expect(status.status == 0 && status.stdout.contains("board simulator"), "\(status.stdout) \(status.stderr)")
    }
}
