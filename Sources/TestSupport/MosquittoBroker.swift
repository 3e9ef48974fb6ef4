import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Why the broker rig could not do what a test asked.
public struct MosquittoError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Debian's Mosquitto broker on a private port, with a password file and
/// an ACL (the test task installs it: scripts/lib/packages).
public final class MosquittoBroker: @unchecked Sendable {
    public static let binary = "/usr/sbin/mosquitto"
    /// Whether the MQTT tests can run here: the broker is installed and
    /// this process can load libmosquitto (the aarch64 tier runs the
    /// suites under qemu-user, where only the host's amd64 library is).
    public static var available: Bool { FileManager.default.isExecutableFile(atPath: binary) && libraryLoads }

    private static let libraryLoads: Bool = {
        guard let handle = dlopen("libmosquitto.so.1", RTLD_NOW | RTLD_LOCAL) else { return false }
        dlclose(handle)
        return true
    }()

    public let directory: String
    public let port: UInt16
    /// A second listener with TLS (the certificate in `directory`, made for
    /// 127.0.0.1 by a CA of the test's own: `ca.crt`), when asked for.
    public let tlsPort: UInt16?
    /// A third listener, with TLS, that wants a client certificate from the
    /// same CA and takes its common name as the user (`client.crt`, CN
    /// board), when TLS is asked for.
    public let certificatePort: UInt16?
    private var process: Process?

    public init(tls: Bool = false) throws {
        // As the daemon and the CLI do: a write to a connection the broker
        // has closed (OpenSSL's TLS alert, say) is an error, not the end of
        // the test process (seen under qemu-user: the bundle died of SIGPIPE).
        signal(SIGPIPE, SIG_IGN)
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("blecontrol-mqtt-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        port = try MosquittoBroker.freePort()
        tlsPort = tls ? try MosquittoBroker.freePort() : nil
        certificatePort = tls ? try MosquittoBroker.freePort() : nil
        var tlsListener = ""
        if let tlsPort, let certificatePort {
            try makeCertificates()
            tlsListener = """
            listener \(tlsPort) 127.0.0.1
            cafile \(directory)/ca.crt
            certfile \(directory)/server.crt
            keyfile \(directory)/server.key
            listener \(certificatePort) 127.0.0.1
            cafile \(directory)/ca.crt
            certfile \(directory)/server.crt
            keyfile \(directory)/server.key
            require_certificate true
            use_identity_as_username true

            """
        }
        // board: may publish and read its own topics; operator: commands.
        try run("/usr/bin/mosquitto_passwd", ["-c", "-b", "\(directory)/passwords", "board", "board-secret"])
        try run("/usr/bin/mosquitto_passwd", ["-b", "\(directory)/passwords", "operator", "operator-secret"])
        try """
        user board
        topic readwrite blecontrol/#
        topic readwrite homeassistant/#
        user operator
        topic readwrite blecontrol/#
        topic read homeassistant/#

        """.write(toFile: "\(directory)/acl", atomically: true, encoding: .utf8)
        // 2.0.21 warns that a later version will refuse an ACL file others can read.
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: "\(directory)/acl")
        // Started as root (CI, the VM), mosquitto drops to its own user
        // before it reads the password file; 2.0.21 (Debian 13) then cannot
        // open the files this test made and exits, where 2.0.11 (Debian 12)
        // read them first. `user root` keeps it as the test's user.
        let runAs = getuid() == 0 ? "user root" : ""
        try """
        \(runAs)
        listener \(port) 127.0.0.1
        allow_anonymous false
        password_file \(directory)/passwords
        acl_file \(directory)/acl
        persistence false
        log_dest file \(directory)/broker.log
        \(tlsListener)
        """.write(toFile: "\(directory)/mosquitto.conf", atomically: true, encoding: .utf8)
        try "board-secret\n".write(toFile: "\(directory)/board.password", atomically: true, encoding: .utf8)
        try start()
    }

    deinit { stop() }

    /// Starts the broker and waits until it accepts connections.
    public func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: MosquittoBroker.binary)
        process.arguments = ["-c", "\(directory)/mosquitto.conf"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        guard eventually({ MosquittoBroker.accepts(port) }) else { throw MosquittoError("mosquitto did not listen on \(port)") }
    }

    /// Freezes the broker (SIGSTOP): its connections stay open and nothing
    /// answers, as when the network between goes silent.
    public func freeze() {
        if let process, process.isRunning { kill(process.processIdentifier, SIGSTOP) }
    }

    /// Lets a frozen broker run again (SIGCONT).
    public func thaw() {
        if let process, process.isRunning { kill(process.processIdentifier, SIGCONT) }
    }

    /// Kills the broker without a word to its clients (SIGKILL).
    public func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    /// A board file's `transports.mqtt` section for this broker, as the
    /// board user (PASSWORD: a file in `directory`), to go after
    /// `transports:`.
    /// With `clientCertificate`, the board proves itself with `client.crt`
    /// on `certificatePort` instead of a user name and password.
    public func mqttSection(password: String = "board.password", keepalive: Int = 5, caFile: String? = nil, clientCertificate: Bool = false) -> String {
        if clientCertificate {
            return """
              mqtt:
                broker: 127.0.0.1:\(certificatePort ?? port)
                ca_file: \(directory)/ca.crt
                cert_file: \(directory)/client.crt
                key_file: \(directory)/client.key
                keepalive_s: \(keepalive)
                status_interval_ms: 100

            """
        }
        let tls = caFile.map { "\n    ca_file: \($0)" } ?? ""
        return """
          mqtt:
            broker: 127.0.0.1:\(caFile != nil ? tlsPort ?? port : port)\(tls)
            username: board
            password_file: \(directory)/\(password)
            keepalive_s: \(keepalive)
            status_interval_ms: 100

        """
    }

    /// A CA and a server certificate for 127.0.0.1 signed by it, and a
    /// second CA that signed nothing (for the refusal), with openssl. The
    /// broker drops to its own user: the key must be readable by it.
    private func makeCertificates() throws {
        let openssl = "/usr/bin/openssl"
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for ca in ["ca", "other-ca"] {
            try check(run(openssl, ["req", "-x509"] + key + ["-keyout", "\(directory)/\(ca).key", "-out", "\(directory)/\(ca).crt",
                                                             "-days", "2", "-subj", "/CN=BLEControl test \(ca)"]), "openssl (CA)")
        }
        try check(run(openssl, ["req"] + key + ["-keyout", "\(directory)/server.key", "-out", "\(directory)/server.csr", "-subj", "/CN=127.0.0.1"]),
                  "openssl (server key)")
        try "subjectAltName=IP:127.0.0.1\n".write(toFile: "\(directory)/san.ext", atomically: true, encoding: .utf8)
        try check(run(openssl, ["x509", "-req", "-in", "\(directory)/server.csr", "-CA", "\(directory)/ca.crt", "-CAkey", "\(directory)/ca.key",
                                "-CAcreateserial", "-out", "\(directory)/server.crt", "-days", "2", "-extfile", "\(directory)/san.ext"]),
                  "openssl (server certificate)")
        try check(run(openssl, ["req"] + key + ["-keyout", "\(directory)/client.key", "-out", "\(directory)/client.csr", "-subj", "/CN=board"]),
                  "openssl (client key)")
        try check(run(openssl, ["x509", "-req", "-in", "\(directory)/client.csr", "-CA", "\(directory)/ca.crt", "-CAkey", "\(directory)/ca.key",
                                "-CAcreateserial", "-out", "\(directory)/client.crt", "-days", "2"]),
                  "openssl (client certificate)")
        chmod("\(directory)/server.key", 0o644)
    }

    private func check(_ status: Int32, _ what: String) throws {
        if status != 0 { throw MosquittoError("\(what) failed (exit \(status))") }
    }

    /// `mosquitto_pub` as the operator.
    public func publish(_ topic: String, _ payload: [UInt8], retain: Bool = false) throws {
        let file = "\(directory)/payload-\(UUID().uuidString)"
        try Data(payload).write(to: URL(fileURLWithPath: file))
        try run("/usr/bin/mosquitto_pub", ["-p", "\(port)", "-u", "operator", "-P", "operator-secret", "-t", topic, "-f", file] + (retain ? ["-r"] : []))
    }

    public func publish(_ topic: String, _ text: String, retain: Bool = false) throws {
        try publish(topic, Array(text.utf8), retain: retain)
    }

    /// One `mosquitto_pub -l` as the operator: each of `lines` a message
    /// on `topic`, in order, over one connection.
    public func publish(_ topic: String, lines: [String]) throws {
        let file = "\(directory)/lines-\(UUID().uuidString)"
        try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/mosquitto_pub")
        process.arguments = ["-p", "\(port)", "-u", "operator", "-P", "operator-secret", "-t", topic, "-l"]
        process.standardInput = try FileHandle(forReadingFrom: URL(fileURLWithPath: file))
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        try check(process.terminationStatus, "mosquitto_pub -l")
    }

    /// What the broker logged so far.
    public var log: String { (try? String(contentsOfFile: "\(directory)/broker.log", encoding: .utf8)) ?? "" }

    /// The retained message on `topic` (its payload as text, or as hex when
    /// `hex`), or nil when there is none.
    public func retained(_ topic: String, hex: Bool = false) -> String? {
        retainedMessages([topic])[topic].map { hex ? $0 : MosquittoSubscriber.text(hex: $0) }
    }

    /// Every retained message under `filter`, by topic (payload as text).
    public func retainedAll(_ filter: String) -> [String: String] {
        retainedMessages([filter]).mapValues { MosquittoSubscriber.text(hex: $0) }
    }

    /// What the broker holds retained under `filters` (payloads as hex), all
    /// of it: the broker sends a new subscriber the retained messages as it
    /// subscribes, before anything published after that, and the subscriber
    /// is ready only once a probe published after it came back. Nothing is
    /// left to a timer (mosquitto_sub -W would be one).
    private func retainedMessages(_ filters: [String]) -> [String: String] {
        guard let subscriber = try? MosquittoSubscriber(self, topics: filters) else { return [:] }
        var result: [String: String] = [:]
        for message in subscriber.messages where message.retained { result[message.topic] = message.hex }
        return result
    }

    private static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return UInt16(bigEndian: address.sin_port)
    }

    private static func accepts(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

/// A `mosquitto_sub` that records what arrives, ready (subscribed) once
/// constructed.
public final class MosquittoSubscriber: @unchecked Sendable {
    /// A message as it arrived: the broker marks `retained` those it held
    /// for the topic and sent on subscribing.
    public struct Received: Sendable {
        public var topic: String
        /// The payload, as hex.
        public var hex: String
        public var retained: Bool
    }

    private static let probeTopic = "blecontrol/test/probe"
    private let process = Process()
    private let pipe = Pipe()
    private let lock = NSLock()
    private var text = ""

    public init(_ broker: MosquittoBroker, topics: [String]) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/mosquitto_sub")
        process.arguments = ["-p", "\(broker.port)", "-u", "operator", "-P", "operator-secret", "-F", "%r %t %x"]
            + (topics + [MosquittoSubscriber.probeTopic]).flatMap { ["-t", $0] }
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        // @Sendable spelled out: Swift 6.0.3 does not infer it for a closure
        // stored into a @Sendable property and rejects the conversion.
        pipe.fileHandleForReading.readabilityHandler = { @Sendable [weak self] handle in
            let data = handle.availableData
            guard let self else { return }
            self.lock.withLock { self.text += String(decoding: data, as: UTF8.self) }
        }
        try process.run()
        // Subscribed once a probe comes back: what is published after this
        // reaches it, and what the broker held retained has arrived before it.
        var probes = 0
        let subscribed = try eventually {
            if messages.contains(where: { $0.topic == MosquittoSubscriber.probeTopic }) { return true }
            probes += 1
            try broker.publish(MosquittoSubscriber.probeTopic, "\(probes)")
            return false
        }
        guard subscribed else { throw MosquittoError("mosquitto_sub never subscribed") }
    }

    deinit {
        pipe.fileHandleForReading.readabilityHandler = nil
        // SIGKILL: Process starts it with the test process's signal mask,
        // SIGTERM blocked.
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Every message so far, in order (whole lines only).
    public var messages: [Received] {
        let complete = lock.withLock { text.split(separator: "\n", omittingEmptySubsequences: false).dropLast() }
        return complete.compactMap { line in
            let fields = line.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { return nil }
            return Received(topic: String(fields[1]), hex: String(fields[2]), retained: fields[0] == "1")
        }
    }

    /// The messages as `topic hexpayload` lines, for failure messages.
    public var lines: [String] { messages.map { "\($0.topic) \($0.hex)" } }

    /// The payloads (hex) that arrived on `topic`.
    public func payloads(_ topic: String) -> [String] {
        messages.filter { $0.topic == topic }.map(\.hex)
    }

    /// `hex` (as mosquitto_sub's %x prints it) decoded as UTF-8 text.
    static func text(hex: String) -> String {
        var bytes: [UInt8] = []
        var digits = hex.utf8.makeIterator()
        while let high = digits.next(), let low = digits.next() {
            guard let byte = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16) else { break }
            bytes.append(byte)
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

@discardableResult
private func run(_ path: String, _ arguments: [String]) throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

