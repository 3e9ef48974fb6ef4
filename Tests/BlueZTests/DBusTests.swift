#if canImport(Glibc)
import Glibc
#endif
import BlueZ
import DBus
import Reactor
import Foundation
import Logging
import Testing
import TestSupport

/// A private `dbus-daemon` on a temporary socket, for the length of one test.
final class PrivateBus: @unchecked Sendable {
    let address: String
    private var pid: pid_t = 0
    private let directory: String
    private let lock = NSLock()

    static let binary = ["/usr/bin/dbus-daemon", "/bin/dbus-daemon"].first { FileManager.default.isExecutableFile(atPath: $0) }

    /// nil when dbus-daemon is not installed (the tests then skip).
    static func start() throws -> PrivateBus? {
        guard let binary else { return nil }
        return try PrivateBus(binary: binary)
    }

    static var available: Bool { binary != nil }

    private init(binary: String) throws {
        directory = NSTemporaryDirectory() + "bluez-tests-\(getpid())-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let socket = directory + "/bus"
        let config = """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>system</type>
          <listen>unix:path=\(socket)</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
            <allow own="*"/>
          </policy>
        </busconfig>
        """
        try config.write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        address = "unix:path=\(socket)"
        // posix_spawn, not Foundation.Process: dbus-daemon ignores SIGTERM
        // here, and Process.waitUntilExit needs a run loop the tests lack.
        let arguments = [binary, "--config-file=\(directory)/bus.conf", "--nofork", "--nopidfile"]
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var child: pid_t = 0
        let status = posix_spawn(&child, binary, nil, nil, &argv, environ)
        guard status == 0 else { throw DBusFailure(DBusFailure.failed, "posix_spawn dbus-daemon: \(status)") }
        pid = child
        // The socket file appears at bind(), before listen(): wait until a
        // connection is accepted, not just for the file.
        let listening = eventually {
            let probe = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(probe) }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                let bytes = Array(socket.utf8)
                raw.copyBytes(from: bytes)
                raw[bytes.count] = 0
            }
            return withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(probe, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            } == 0
        }
        if !listening {
            stop()
            throw DBusFailure(DBusFailure.failed, "dbus-daemon never listened on \(socket)")
        }
    }

    func stop() {
        let child = lock.withLock { () -> pid_t in
            defer { pid = 0 }
            return pid
        }
        if child > 0 {
            kill(child, SIGKILL)
            var status: Int32 = 0
            waitpid(child, &status, 0)
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    deinit { stop() }
}

final class Collected<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []
    func append(_ item: T) { lock.withLock { items.append(item) } }
    var all: [T] { lock.withLock { items } }
}

let logger = Logger(label: "bluez-tests")

/// One loop for the test's connections (the daemon gives D-Bus a loop of its own).
func testLoop() throws -> EventLoop {
    let loop = try EventLoop(name: "dbus-test")
    loop.start()
    return loop
}

extension DBusConnection {
    /// Takes `name` on the bus (a fake bluetoothd takes org.bluez) and
    /// waits for the bus's answer: whether it is ours.
    @discardableResult
    func own(_ name: String) -> Bool {
        let claimed = Collected<Bool>()
        requestName(name) { claimed.append((try? $0.get()) ?? false) }
        return eventually { claimed.all == [true] }
    }
}

@Suite(.serialized, .enabled(if: PrivateBus.available, "dbus-daemon is not installed"))
struct DBusConnectionTests {
    /// Two connections on one private bus: a service with an echo method and
    /// a property, and a client.
    func withPair(_ body: (DBusConnection, DBusConnection, PrivateBus) throws -> Void) throws {
        guard let bus = try PrivateBus.start() else { return }
        defer { bus.stop() }
        let loop = try testLoop()
        defer { loop.stop() }
        let service = try DBusConnection(address: bus.address, loop: loop, logger: logger)
        let client = try DBusConnection(address: bus.address, loop: loop, logger: logger)
        defer {
            client.close()
            service.close()
        }
        try body(service, client, bus)
    }

    @Test func everyTypeRoundTripsThroughAnEchoMethod() throws {
        try withPair { service, client, _ in
            let echo = DBusInterface("org.example.Echo")
            echo.method("Echo", in: "v", out: "v") { call in call.reply(call.arguments) }
            service.export(path: "/org/example/echo", interfaces: [echo])
            let values: [DBusValue] = [
                .byte(200), .bool(true), .int16(-3), .uint16(65000), .int32(-70000), .uint32(4_000_000_000),
                .int64(-5_000_000_000), .uint64(18_000_000_000_000_000_000), .double(2.5), .string("grüße"),
                .objectPath("/org/bluez/hci0"), .signature("a{sv}"), .bytes([0, 1, 0xFF]), .bytes([]),
                .strings(["a", "b"]), .properties([("Powered", .bool(true)), ("Name", .string("x"))]),
                .structure([.int32(1), .string("two")]),
                .dictionary(key: "o", value: "a{sa{sv}}", [DBusEntry(.objectPath("/a"), .dictionary(key: "s", value: "a{sv}", [DBusEntry(.string("org.x"), .properties([("V", .bytes([9]))]))]))]),
                .array(element: "(ay)", [.structure([.bytes([1, 2])])]),
            ]
            for value in values {
                let reply = try client.callAndWait(destination: service.uniqueName, path: "/org/example/echo", interface: "org.example.Echo", method: "Echo", arguments: [.variant(value)], timeout: Patience.time)
                #expect(reply == [.variant(value)], "\(value.signature)")
            }
        }
    }

    @Test func wrongArgumentsAndUnknownTargetsAreNamedErrors() throws {
        try withPair { service, client, _ in
            let echo = DBusInterface("org.example.Echo")
            echo.method("Fail", in: "") { call in call.fail("org.example.Error.Broken", "it broke") }
            service.export(path: "/org/example/echo", interfaces: [echo])
            func error(_ path: String, _ interface: String, _ method: String, _ arguments: [DBusValue] = []) -> String? {
                do {
                    _ = try client.callAndWait(destination: service.uniqueName, path: path, interface: interface, method: method, arguments: arguments, timeout: Patience.time)
                    return nil
                } catch let failure as DBusFailure {
                    return failure.name
                } catch { return "\(error)" }
            }
            #expect(error("/org/example/echo", "org.example.Echo", "Fail") == "org.example.Error.Broken")
            #expect(error("/org/example/echo", "org.example.Echo", "Fail", [.int32(1)]) == DBusFailure.invalidArgs)
            #expect(error("/org/example/echo", "org.example.Echo", "Nope") == DBusFailure.unknownMethod)
            #expect(error("/org/example/echo", "org.example.Other", "Fail") == DBusFailure.unknownInterface)
            #expect(error("/org/example/none", "org.example.Echo", "Fail") == DBusFailure.unknownObject)
            #expect(error("/", "org.freedesktop.DBus", "GetNameOwner", [.string("org.example.nobody")]).map { _ in true } == true)
        }
    }

    @Test func aCallWithoutAnswerTimesOut() throws {
        try withPair { service, client, _ in
            let holder = Collected<DBusMethodCall>()
            let slow = DBusInterface("org.example.Slow")
            slow.method("Never") { call in holder.append(call) }  // kept, never answered
            service.export(path: "/slow", interfaces: [slow])
            do {
                _ = try client.callAndWait(destination: service.uniqueName, path: "/slow", interface: "org.example.Slow", method: "Never", timeout: .milliseconds(200))
                Issue.record("a call nobody answered returned")
            } catch let failure as DBusFailure {
                #expect(failure.name == DBusFailure.noReply)
            }
            // Answering late, from another thread, is harmless.
            holder.all.first?.reply()
        }
    }

    @Test func aLaterReplyFromAnotherThreadArrives() throws {
        try withPair { service, client, _ in
            let later = DBusInterface("org.example.Later")
            later.method("Wait", in: "u", out: "s") { call in
                let delay = call.arguments.first?.integerValue ?? 0
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(delay)) { call.reply([.string("done")]) }
            }
            service.export(path: "/later", interfaces: [later])
            let reply = try client.callAndWait(destination: service.uniqueName, path: "/later", interface: "org.example.Later", method: "Wait", arguments: [.uint32(100)], timeout: Patience.time)
            #expect(reply == [.string("done")])
        }
    }

    @Test func propertiesObjectManagerAndIntrospection() throws {
        try withPair { service, client, _ in
            let state = Collected<Bool>()
            let thing = DBusInterface("org.example.Thing")
            thing.property("Name", "s", get: { .string("thing") })
            thing.property("On", "b", get: { .bool(state.all.last ?? false) }, set: { value in state.append(value.boolValue ?? false) })
            service.exportObjectManager(at: "/app")
            service.export(path: "/app/thing0", interfaces: [thing])
            let properties = "org.freedesktop.DBus.Properties"
            let name = service.uniqueName
            #expect(try client.callAndWait(destination: name, path: "/app/thing0", interface: properties, method: "Get", arguments: [.string("org.example.Thing"), .string("Name")], timeout: Patience.time) == [.variant(.string("thing"))])
            _ = try client.callAndWait(destination: name, path: "/app/thing0", interface: properties, method: "Set", arguments: [.string("org.example.Thing"), .string("On"), .variant(.bool(true))], timeout: Patience.time)
            let all = try client.callAndWait(destination: name, path: "/app/thing0", interface: properties, method: "GetAll", arguments: [.string("org.example.Thing")], timeout: Patience.time)
            #expect(all.first?.dictionaryValue?["On"]?.boolValue == true)
            #expect(throws: DBusFailure.self) {
                _ = try client.callAndWait(destination: name, path: "/app/thing0", interface: properties, method: "Set", arguments: [.string("org.example.Thing"), .string("Name"), .variant(.string("y"))], timeout: Patience.time)
            }
            let managed = try client.callAndWait(destination: name, path: "/app", interface: "org.freedesktop.DBus.ObjectManager", method: "GetManagedObjects", timeout: Patience.time)
            let objects = managed.first?.dictionaryValue
            #expect(objects?.keys.sorted() == ["/app/thing0"])
            #expect(objects?["/app/thing0"]?.dictionaryValue?["org.example.Thing"]?.dictionaryValue?["Name"]?.stringValue == "thing")
            let xml = try client.callAndWait(destination: name, path: "/app", interface: "org.freedesktop.DBus.Introspectable", method: "Introspect", timeout: Patience.time).first?.stringValue ?? ""
            #expect(xml.contains("<node name=\"thing0\"/>"))
            #expect(xml.contains("org.freedesktop.DBus.ObjectManager"))
            let thingXML = try client.callAndWait(destination: name, path: "/app/thing0", interface: "org.freedesktop.DBus.Introspectable", method: "Introspect", timeout: Patience.time).first?.stringValue ?? ""
            #expect(thingXML.contains("<property name=\"On\" type=\"b\" access=\"readwrite\"/>"))
        }
    }

    @Test func signalsReachMatchingSubscribersOnly() throws {
        try withPair { service, client, _ in
            let seen = Collected<String>()
            client.addMatch(DBusMatchRule(interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", pathNamespace: "/app")) { signal in
                let changed = signal.arguments.count > 1 ? signal.arguments[1].dictionaryValue : nil
                seen.append("\(signal.path ?? "") \(changed?["Value"]?.byteArray ?? [])")
            }
            let added = Collected<String>()
            client.addMatch(DBusMatchRule(interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesAdded")) { signal in
                added.append(signal.arguments.first?.stringValue ?? "")
            }
            // AddMatch is asynchronous: a round trip through the bus orders it before the signals.
            _ = try client.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "GetId", timeout: Patience.time)
            var value: [UInt8] = [0xFF, 0x01, 0x09]
            let characteristic = DBusInterface("org.example.Char")
            let box = Collected<[UInt8]>()
            box.append(value)
            characteristic.property("Value", "ay", get: { .bytes(box.all.last ?? []) })
            service.exportObjectManager(at: "/app")
            service.export(path: "/app/char0", interfaces: [characteristic])
            service.export(path: "/other", interfaces: [characteristic])
            service.emitPropertiesChanged(path: "/other", interface: "org.example.Char", names: ["Value"])
            service.emitPropertiesChanged(path: "/app/char0", interface: "org.example.Char", changed: [("Value", .bytes(value))])
            value = [1, 2]
            box.append(value)
            service.emitPropertiesChanged(path: "/app/char0", interface: "org.example.Char", names: ["Value"])
            #expect(eventually { seen.all.count == 2 })
            #expect(seen.all == ["/app/char0 [255, 1, 9]", "/app/char0 [1, 2]"])
            #expect(eventually { added.all == ["/app/char0"] })
        }
    }

    @Test func aUnixFileDescriptorCrossesTheBus() throws {
        try withPair { service, client, _ in
            let received = Collected<Int32>()
            let sink = DBusInterface("org.example.Sink")
            sink.method("Take", in: "h") { call in
                if case .unixFD(let fd)? = call.arguments.first { received.append(fd) }
                call.reply()
            }
            service.export(path: "/sink", interfaces: [sink])
            var fds: [Int32] = [-1, -1]
            #expect(pipe(&fds) == 0)
            _ = try client.callAndWait(destination: service.uniqueName, path: "/sink", interface: "org.example.Sink", method: "Take", arguments: [.unixFD(fds[1])], timeout: Patience.time)
            close(fds[1])
            guard let passed = received.all.first else { Issue.record("no descriptor arrived"); return }
            var bytes: [UInt8] = [0x02, 0x03, 0x00]
            #expect(write(passed, &bytes, 3) == 3)
            close(passed)
            var back = [UInt8](repeating: 0, count: 8)
            #expect(read(fds[0], &back, 8) == 3)
            #expect(Array(back.prefix(3)) == [0x02, 0x03, 0x00])
            close(fds[0])
        }
    }

    @Test func theBusGoingAwayIsReportedAndCallsFail() throws {
        guard let bus = try PrivateBus.start() else { return }
        let loop = try testLoop()
        defer { loop.stop() }
        let connection = try DBusConnection(address: bus.address, loop: loop, logger: logger)
        defer { connection.close() }
        let lost = Collected<Bool>()
        connection.onDisconnect = { lost.append(true) }
        bus.stop()
        #expect(eventually { lost.all == [true] })
        #expect(throws: DBusFailure.self) {
            _ = try connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "GetId", timeout: Patience.time)
        }
    }

    @Test func noBusAtTheAddressIsAnError() throws {
        let loop = try testLoop()
        defer { loop.stop() }
        #expect(throws: DBusFailure.self) {
            _ = try DBusConnection(address: "unix:path=/nonexistent/bus-\(getpid())", loop: loop, logger: logger)
        }
    }

    @Test func aCallerTheServerDoesNotAcceptIsDeniedAndCounted() throws {
        try withPair { service, client, _ in
            let echo = DBusInterface("org.example.Echo")
            echo.method("Ping") { call in call.reply() }
            service.export(path: "/echo", interfaces: [echo])
            let clientName = client.uniqueName
            service.acceptCaller = { $0 != clientName }
            do {
                _ = try client.callAndWait(destination: service.uniqueName, path: "/echo", interface: "org.example.Echo", method: "Ping", timeout: Patience.time)
                Issue.record("a refused caller got through")
            } catch let failure as DBusFailure {
                #expect(failure.name == DBusFailure.accessDenied)
            }
            // Introspection stays open to anyone.
            _ = try client.callAndWait(destination: service.uniqueName, path: "/echo", interface: "org.freedesktop.DBus.Introspectable", method: "Introspect", timeout: Patience.time)
            #expect(try service.loop.submitAndWait { service.deniedCalls } == 1)
        }
    }

    /// A rule's sender is checked on arrival, not only by the bus: a unicast
    /// signal reaches its destination whatever that connection asked for.
    @Test func aRuleWithASenderTakesOnlyThatNamesCurrentOwnerAndTheBusOnlyFromTheBus() throws {
        try withPair { owner, listener, bus in
            let loop = try testLoop()
            defer { loop.stop() }
            let stranger = try DBusConnection(address: bus.address, loop: loop, logger: logger)
            defer { stranger.close() }
            #expect(owner.own("org.example.Owner"))
            let heard = Collected<String>()
            let ownerChanges = Collected<String>()
            listener.addMatch(DBusMatchRule(sender: "org.example.Owner", interface: "org.example.News", member: "Said")) { signal in
                heard.append(signal.arguments.first?.stringValue ?? "?")
            }
            listener.addMatch(DBusMatchRule(sender: DBusMatchRule.bus, interface: DBusMatchRule.bus, member: "NameOwnerChanged", arg0: "org.example.Owner")) { signal in
                ownerChanges.append(signal.arguments.last?.stringValue ?? "?")
            }
            #expect(eventually { (try? listener.loop.submitAndWait { listener.knownOwner(of: "org.example.Owner") }) == owner.uniqueName })
            let say = { (connection: DBusConnection, text: String, destination: String?) in
                connection.emitSignal(path: "/news", interface: "org.example.News", member: "Said", arguments: [.string(text)], destination: destination)
            }
            say(stranger, "forged, unicast", listener.uniqueName)
            say(stranger, "forged, broadcast", nil)
            stranger.emitSignal(path: "/org/freedesktop/DBus", interface: DBusMatchRule.bus, member: "NameOwnerChanged",
                                arguments: [.string("org.example.Owner"), .string(owner.uniqueName), .string(stranger.uniqueName)], destination: listener.uniqueName)
            say(stranger, "forged after the forged owner change", listener.uniqueName)
            say(owner, "true", nil)
            // The stranger's three unicast forgeries (its broadcast one the
            // bus itself keeps from a rule that names another sender).
            #expect(eventually { heard.all == ["true"] && (try? listener.loop.submitAndWait { listener.deniedSignals }) == 3 })
            #expect(try listener.loop.submitAndWait { listener.knownOwner(of: "org.example.Owner") } == owner.uniqueName)
            #expect(ownerChanges.all.isEmpty)
            // The name really changes hands: the bus says so, and the new
            // owner is believed from then on, the old one no more.
            let released = Collected<Bool>()
            owner.call(destination: DBusMatchRule.bus, path: "/org/freedesktop/DBus", interface: DBusMatchRule.bus, method: "ReleaseName",
                       arguments: [.string("org.example.Owner")]) { released.append((try? $0.get()) != nil) }
            #expect(eventually { released.all == [true] })
            #expect(stranger.own("org.example.Owner"))
            #expect(eventually { ownerChanges.all == ["", stranger.uniqueName] })
            say(owner, "old owner", listener.uniqueName)
            say(stranger, "new owner", nil)
            #expect(eventually { heard.all == ["true", "new owner"] })
        }
    }

    @Test func aLargeByteArrayStaysCompact() throws {
        try withPair { service, client, _ in
            let sink = DBusInterface("org.example.Sink")
            let sizes = Collected<Int>()
            sink.method("Put", in: "ay") { call in
                if case .bytes(let bytes)? = call.arguments.first { sizes.append(bytes.count) }
                call.reply()
            }
            service.export(path: "/sink", interfaces: [sink])
            _ = try client.callAndWait(destination: service.uniqueName, path: "/sink", interface: "org.example.Sink", method: "Put",
                                       arguments: [.bytes([UInt8](repeating: 7, count: 4 << 20))], timeout: Patience.time)
            #expect(sizes.all == [4 << 20], "read as one byte buffer, not one value per byte")
        }
    }
}
