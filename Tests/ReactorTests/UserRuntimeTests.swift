#if canImport(Glibc)
import Glibc
#endif
import Reactor
import Testing

@Suite("A user's private socket directory")
struct UserRuntimeTests {
    /// A scratch directory under /tmp, removed afterwards.
    private func scratch(_ body: (String) throws -> Void) rethrows {
        var template = Array("/tmp/blecontrol-user-XXXXXX".utf8CString)
        let path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        defer { _ = Subprocess.output(of: "/bin/rm", ["-rf", path]) }
        try body(path)
    }

    @Test("The simulator's socket: in $XDG_RUNTIME_DIR when it is the user's own, else in /tmp/blecontrol-UID")
    func simulatorSocketPath() {
        scratch { directory in
            let uid = geteuid()
            chmod(directory, 0o700)
            #expect(UserRuntime.simulatorSocketPath(runtimeDirectory: directory, uid: uid) == directory + "/blecontrol-simulator.sock")
            #expect(UserRuntime.simulatorSocketPath(runtimeDirectory: nil, uid: uid) == "/tmp/blecontrol-\(uid)/simulator.sock")
            // A runtime directory others may write, or someone else's, is not used.
            chmod(directory, 0o1777)
            #expect(UserRuntime.simulatorSocketPath(runtimeDirectory: directory, uid: uid) == "/tmp/blecontrol-\(uid)/simulator.sock")
            chmod(directory, 0o700)
            #expect(UserRuntime.simulatorSocketPath(runtimeDirectory: directory, uid: uid &+ 1) == "/tmp/blecontrol-\(uid &+ 1)/simulator.sock")
        }
    }

    @Test("The private directory is made with mode 0700; someone else's, a group-writable one or a link is refused")
    func privateDirectory() throws {
        try scratch { parent in
            let made = parent + "/mine"
            try UserRuntime.makePrivateDirectory(made)
            var info = stat()
            #expect(lstat(made, &info) == 0 && info.st_mode & 0o777 == 0o700 && info.st_uid == geteuid())
            try UserRuntime.makePrivateDirectory(made)  // there already: fine

            mkdir(parent + "/shared", 0o700)
            chmod(parent + "/shared", 0o775)
            #expect(throws: UserRuntime.Refusal.self) { try UserRuntime.makePrivateDirectory(parent + "/shared") }
            symlink(made, parent + "/link")
            let link = refusal { try UserRuntime.makePrivateDirectory(parent + "/link") }
            #expect(link?.description.contains("is not a directory") == true)
            if geteuid() == 0 {
                mkdir(parent + "/theirs", 0o700)
                chown(parent + "/theirs", 65534, 65534)
                let theirs = refusal { try UserRuntime.makePrivateDirectory(parent + "/theirs") }
                #expect(theirs?.description.contains("belongs to") == true && theirs?.description.contains("uid 65534") == true, "\(String(describing: theirs))")
            }
        }
    }
}

/// The refusal `body` throws, nil when it throws none (or another error).
/// (Swift 6.0.3's `#expect(throws:)`, the floor, returns no error to look into.)
private func refusal(_ body: () throws -> Void) -> UserRuntime.Refusal? {
    do {
        try body()
        return nil
    } catch let refusal as UserRuntime.Refusal {
        return refusal
    } catch {
        return nil
    }
}
