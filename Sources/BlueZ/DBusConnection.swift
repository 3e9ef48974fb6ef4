#if canImport(Glibc)
import Glibc
#endif
import CDBus
import Foundation
import Logging

/// A D-Bus error, as received in an error reply or sent as one.
public struct DBusFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// The error name, such as `org.freedesktop.DBus.Error.ServiceUnknown`.
    public var name: String
    public var message: String

    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { message.isEmpty ? name : "\(name): \(message)" }

    public static let failed = "org.freedesktop.DBus.Error.Failed"
    public static let noReply = "org.freedesktop.DBus.Error.NoReply"
    public static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
    public static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
    public static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
    public static let unknownInterface = "org.freedesktop.DBus.Error.UnknownInterface"
    public static let unknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
    public static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
    public static let propertyReadOnly = "org.freedesktop.DBus.Error.PropertyReadOnly"
    public static let nameHasNoOwner = "org.freedesktop.DBus.Error.NameHasNoOwner"
}

/// A received message (signal, or the header of a method call).
public struct DBusMessageInfo: Sendable {
    public enum Kind: Sendable { case methodCall, methodReturn, error, signal }
    public var kind: Kind
    public var path: String?
    public var interface: String?
    public var member: String?
    public var sender: String?
    public var destination: String?
    public var errorName: String?
    public var arguments: [DBusValue]
}

/// Which signals a handler wants; both the bus (AddMatch) and the local
/// dispatch use it. `sender` is compared by the bus only (signals carry
/// the sender's unique name locally).
public struct DBusMatchRule: Sendable, Hashable {
    public var sender: String?
    public var interface: String?
    public var member: String?
    public var path: String?
    public var pathNamespace: String?
    public var arg0: String?

    public init(sender: String? = nil, interface: String? = nil, member: String? = nil, path: String? = nil, pathNamespace: String? = nil, arg0: String? = nil) {
        self.sender = sender
        self.interface = interface
        self.member = member
        self.path = path
        self.pathNamespace = pathNamespace
        self.arg0 = arg0
    }

    /// The rule in the bus daemon's syntax.
    public var text: String {
        var parts = ["type='signal'"]
        if let sender { parts.append("sender='\(sender)'") }
        if let interface { parts.append("interface='\(interface)'") }
        if let member { parts.append("member='\(member)'") }
        if let path { parts.append("path='\(path)'") }
        if let pathNamespace { parts.append("path_namespace='\(pathNamespace)'") }
        if let arg0 { parts.append("arg0='\(arg0)'") }
        return parts.joined(separator: ",")
    }

    func matches(_ message: DBusMessageInfo) -> Bool {
        guard message.kind == .signal else { return false }
        if let interface, message.interface != interface { return false }
        if let member, message.member != member { return false }
        if let path, message.path != path { return false }
        if let pathNamespace, let messagePath = message.path {
            if pathNamespace != "/", messagePath != pathNamespace, !messagePath.hasPrefix(pathNamespace + "/") { return false }
        }
        if let arg0, message.arguments.first?.stringValue != arg0 { return false }
        return true
    }
}

/// A method call made to one of our exported objects. Answer it exactly
/// once, from any thread, now or later (a GATT write with response is
/// answered only once the hardware has the frames).
public final class DBusMethodCall: @unchecked Sendable {
    // `message` is only read; libdbus's message refcount is atomic once
    // threads are initialised; `answered` is under `lock`.
    public let path: String
    public let interface: String
    public let member: String
    public let sender: String
    public let arguments: [DBusValue]
    private let message: OpaquePointer
    private weak var connection: DBusConnection?
    private let lock = NSLock()
    private var answered = false

    init(message: OpaquePointer, connection: DBusConnection, path: String, interface: String, member: String, sender: String, arguments: [DBusValue]) {
        dbus_message_ref(message)
        self.message = message
        self.connection = connection
        self.path = path
        self.interface = interface
        self.member = member
        self.sender = sender
        self.arguments = arguments
    }

    deinit {
        if !answered, dbus_message_get_no_reply(message) == 0 {
            // Never leave the caller waiting for its timeout.
            let reply = dbus_message_new_error(message, DBusFailure.failed, "no reply")
            if let reply, let connection { connection.sendReleasing(reply) } else if let reply { dbus_message_unref(reply) }
        }
        dbus_message_unref(message)
    }

    private func claim() -> Bool {
        lock.withLock {
            defer { answered = true }
            return !answered && dbus_message_get_no_reply(message) == 0
        }
    }

    /// The method return, with `values` as its out arguments.
    public func reply(_ values: [DBusValue] = []) {
        guard claim(), let connection, let reply = dbus_message_new_method_return(message) else { return }
        do {
            try DBusMarshal.append(values, to: reply)
        } catch {
            dbus_message_unref(reply)
            connection.logger.error("reply to \(interface).\(member): \(error)")
            if let failure = dbus_message_new_error(message, DBusFailure.failed, "\(error)") { connection.sendReleasing(failure) }
            return
        }
        connection.sendReleasing(reply)
    }

    /// An error reply.
    public func fail(_ failure: DBusFailure) {
        guard claim(), let connection else { return }
        let name = DBusNames.isValidErrorName(failure.name) ? failure.name : DBusFailure.failed
        if let reply = dbus_message_new_error(message, name, failure.message) { connection.sendReleasing(reply) }
    }

    public func fail(_ name: String, _ message: String) { fail(DBusFailure(name, message)) }
}

/// One interface of an exported object: its methods, properties (read on
/// the connection's thread whenever asked) and, for introspection, signals.
public final class DBusInterface: @unchecked Sendable {
    // Built before export and then used only on the connection's thread.
    public struct Method {
        public var inSignature: String
        public var outSignature: String
        public var handler: (DBusMethodCall) -> Void
        public init(in inSignature: String = "", out outSignature: String = "", _ handler: @escaping (DBusMethodCall) -> Void) {
            self.inSignature = inSignature
            self.outSignature = outSignature
            self.handler = handler
        }
    }

    public struct Property {
        public var signature: String
        public var get: () -> DBusValue
        /// nil: read-only.
        public var set: ((DBusValue) throws -> Void)?
        public init(_ signature: String, get: @escaping () -> DBusValue, set: ((DBusValue) throws -> Void)? = nil) {
            self.signature = signature
            self.get = get
            self.set = set
        }
    }

    public let name: String
    public var methods: [String: Method] = [:]
    /// In declaration order, for stable GetAll and introspection output.
    public private(set) var propertyNames: [String] = []
    public private(set) var properties: [String: Property] = [:]
    /// Signal name → argument signature (introspection only).
    public var signals: [String: String] = [:]

    public init(_ name: String) { self.name = name }

    public func method(_ name: String, in inSignature: String = "", out outSignature: String = "", _ handler: @escaping (DBusMethodCall) -> Void) {
        methods[name] = Method(in: inSignature, out: outSignature, handler)
    }

    public func property(_ name: String, _ signature: String, get: @escaping () -> DBusValue, set: ((DBusValue) throws -> Void)? = nil) {
        if properties[name] == nil { propertyNames.append(name) }
        properties[name] = Property(signature, get: get, set: set)
    }

    /// Current values of every property.
    public func allProperties() -> DBusValue {
        .properties(propertyNames.compactMap { name in properties[name].map { (name, $0.get()) } })
    }
}

/// A private connection to a message bus over libdbus-1, living on a
/// ``DBusThread`` of its own. Every public method is safe from any thread;
/// handlers and replies run on the connection's thread.
public final class DBusConnection: @unchecked Sendable {
    // Thread-confined: everything mutable is used on `thread` only (other
    // threads hop with `execute`), which makes the unchecked Sendable sound.
    private var raw: OpaquePointer?
    public let thread: DBusThread
    private let ownsThread: Bool
    let logger: Logger
    /// Our unique name on the bus (`:1.42`).
    public let uniqueName: String
    /// The address we connected to.
    public let address: String

    private var watches: [OpaquePointer] = []
    private var timeouts: [(timeout: OpaquePointer, deadline: ContinuousClock.Instant)] = []
    private var pending: [UInt32: (handler: (Result<[DBusValue], DBusFailure>) -> Void, timer: DBusThread.Token)] = [:]
    private var matches: [UInt64: (rule: DBusMatchRule, handler: (DBusMessageInfo) -> Void)] = [:]
    private var nextMatchID: UInt64 = 0
    private var objects: [String: [DBusInterface]] = [:]
    private var objectManagers: Set<String> = []
    private var closed = false
    private var disconnectHandler: (@Sendable () -> Void)?
    /// The bus went away (daemon stopped, socket closed). Runs on the thread, once.
    public var onDisconnect: (@Sendable () -> Void)? {
        get { idLock.withLock { disconnectHandler } }
        set { idLock.withLock { disconnectHandler = newValue } }
    }

    /// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket.
    public static var systemBusAddress: String {
        if let address = ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"], !address.isEmpty { return address }
        return "unix:path=/var/run/dbus/system_bus_socket"
    }

    /// Connects to the system bus (honouring `DBUS_SYSTEM_BUS_ADDRESS`).
    public static func system(logger: Logger) throws -> DBusConnection {
        try DBusConnection(address: systemBusAddress, logger: logger)
    }

    /// Opens a private connection to the bus at `address`, says Hello
    /// (blocking the caller for at most the bus's reply) and starts a thread
    /// for it, or lives on `thread` (already started; the caller's thread
    /// then, since only one connection can use a thread at a time).
    public init(address: String, logger: Logger, thread sharedThread: DBusThread? = nil, threadName: String = "blecontrol-dbus") throws {
        dbus_threads_init_default()
        self.address = address
        self.logger = logger
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let connection = dbus_connection_open_private(address, &error) else {
            throw DBusConnection.failure(from: &error, fallback: "cannot connect to \(address)")
        }
        // A lost bus must never exit the daemon (libdbus's default for buses).
        dbus_connection_set_exit_on_disconnect(connection, 0)
        guard dbus_bus_register(connection, &error) != 0 else {
            let failure = DBusConnection.failure(from: &error, fallback: "Hello failed on \(address)")
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            throw failure
        }
        raw = connection
        uniqueName = dbus_bus_get_unique_name(connection).map { String(cString: $0) } ?? ""
        ownsThread = sharedThread == nil
        thread = sharedThread ?? DBusThread()

        let context = Unmanaged.passUnretained(self).toOpaque()
        dbus_connection_set_watch_functions(connection, { watch, data in
            guard let watch, let data else { return 0 }
            Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue().watches.append(watch)
            return 1
        }, { watch, data in
            guard let watch, let data else { return }
            Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue().watches.removeAll { $0 == watch }
        }, { _, _ in
            // Enabled state is read each round from the watch itself.
        }, context, nil)
        dbus_connection_set_timeout_functions(connection, { timeout, data in
            guard let timeout, let data else { return 0 }
            let this = Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue()
            this.timeouts.append((timeout, .now + .milliseconds(Int(dbus_timeout_get_interval(timeout)))))
            return 1
        }, { timeout, data in
            guard let timeout, let data else { return }
            Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue().timeouts.removeAll { $0.timeout == timeout }
        }, { timeout, data in
            guard let timeout, let data else { return }
            let this = Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue()
            if let index = this.timeouts.firstIndex(where: { $0.timeout == timeout }) {
                this.timeouts[index].deadline = .now + .milliseconds(Int(dbus_timeout_get_interval(timeout)))
            }
        }, context, nil)
        dbus_connection_set_wakeup_main_function(connection, { data in
            guard let data else { return }
            Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue().thread.wake()
        }, context, nil)
        dbus_connection_add_filter(connection, { _, message, data in
            guard let message, let data else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
            return Unmanaged<DBusConnection>.fromOpaque(data).takeUnretainedValue().filter(message)
        }, context, nil)

        thread.pollSources = { [weak self] in self?.pollSources() ?? [] }
        thread.extraDeadline = { [weak self] in self?.timeouts.filter { dbus_timeout_get_enabled($0.timeout) != 0 }.map(\.deadline).min() }
        thread.afterRound = { [weak self] in self?.afterRound() }
        if ownsThread { thread.start(name: threadName) }
    }

    deinit {
        if ownsThread { thread.stop() }
        if let raw {
            dbus_connection_close(raw)
            dbus_connection_unref(raw)
        }
    }

    /// Closes the connection and ends its thread. Pending calls fail.
    public func close() {
        let work: @Sendable () -> Void = { [self] in
            guard !closed else { return }
            closed = true
            failPending(DBusFailure(DBusFailure.disconnected, "connection closed"))
            if let raw {
                dbus_connection_close(raw)
                dbus_connection_unref(raw)
                self.raw = nil
            }
            watches.removeAll()
            timeouts.removeAll()
            if !ownsThread {
                thread.pollSources = { [] }
                thread.extraDeadline = { nil }
                thread.afterRound = {}
            }
        }
        if thread.isCurrent { work() } else { thread.execute(work) }
        if ownsThread { thread.stop() }
    }

    /// True until the bus goes away or ``close()``.
    public var isConnected: Bool {
        guard let raw else { return false }
        return dbus_connection_get_is_connected(raw) != 0
    }

    /// Runs `work` on the connection's thread.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        if thread.isCurrent { work() } else { thread.execute(work) }
    }

    // MARK: Calls

    /// Calls a method; `completion` runs on the connection's thread with the
    /// out arguments or the error (a timeout is `NoReply`).
    public func call(destination: String, path: String, interface: String, method: String, arguments: [DBusValue] = [], timeout: Duration = .seconds(5), completion: @escaping @Sendable (Result<[DBusValue], DBusFailure>) -> Void) {
        execute { [self] in
            guard let raw, !closed else { return completion(.failure(DBusFailure(DBusFailure.disconnected, "not connected"))) }
            guard DBusNames.isValidBusName(destination), DBusNames.isValidPath(path), DBusNames.isValidInterface(interface), DBusNames.isValidMember(method),
                  let message = dbus_message_new_method_call(destination, path, interface, method) else {
                return completion(.failure(DBusFailure(DBusFailure.invalidArgs, "bad call \(destination) \(path) \(interface).\(method)")))
            }
            defer { dbus_message_unref(message) }
            do { try DBusMarshal.append(arguments, to: message) } catch {
                return completion(.failure(DBusFailure(DBusFailure.invalidArgs, "\(error)")))
            }
            var serial: dbus_uint32_t = 0
            guard dbus_connection_send(raw, message, &serial) != 0 else {
                return completion(.failure(DBusFailure(DBusFailure.failed, "out of memory")))
            }
            let timer = thread.schedule(after: timeout) { [weak self] in
                guard let self, let entry = self.pending.removeValue(forKey: serial) else { return }
                entry.handler(.failure(DBusFailure(DBusFailure.noReply, "\(interface).\(method) on \(destination) timed out")))
            }
            pending[serial] = (completion, timer)
        }
    }

    /// Calls a method and waits for the answer (never on the connection's thread).
    public func callAndWait(destination: String, path: String, interface: String, method: String, arguments: [DBusValue] = [], timeout: Duration = .seconds(5)) throws -> [DBusValue] {
        precondition(!thread.isCurrent, "callAndWait on the D-Bus thread would deadlock")
        let box = ResultBox()
        let done = DispatchSemaphore(value: 0)
        call(destination: destination, path: path, interface: interface, method: method, arguments: arguments, timeout: timeout) { result in
            box.result = result
            done.signal()
        }
        done.wait()
        return try box.result!.get()
    }

    private final class ResultBox: @unchecked Sendable { var result: Result<[DBusValue], DBusFailure>? }

    /// Asks the bus for `name` (DBUS_NAME_FLAG_DO_NOT_QUEUE); completion gets whether we own it.
    public func requestName(_ name: String, completion: @escaping @Sendable (Result<Bool, DBusFailure>) -> Void) {
        call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "RequestName", arguments: [.string(name), .uint32(4)]) { result in
            completion(result.map { $0.first?.integerValue == 1 || $0.first?.integerValue == 4 })
        }
    }

    // MARK: Signals

    /// Subscribes to signals matching `rule` (AddMatch on the bus, dispatch
    /// here). Returns a token for ``removeMatch(_:)``.
    @discardableResult
    public func addMatch(_ rule: DBusMatchRule, handler: @escaping (DBusMessageInfo) -> Void) -> UInt64 {
        let id = matchID()
        let box = HandlerBox(handler)
        execute { [self] in
            matches[id] = (rule, box.handler)
            call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "AddMatch", arguments: [.string(rule.text)]) { [logger] result in
                if case .failure(let error) = result { logger.warning("AddMatch \(rule.text): \(error)") }
            }
        }
        return id
    }

    public func removeMatch(_ id: UInt64) {
        execute { [self] in
            guard let entry = matches.removeValue(forKey: id) else { return }
            call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "RemoveMatch", arguments: [.string(entry.rule.text)]) { _ in }
        }
    }

    private let idLock = NSLock()
    private func matchID() -> UInt64 { idLock.withLock { nextMatchID += 1; return nextMatchID } }

    private final class HandlerBox: @unchecked Sendable {
        let handler: (DBusMessageInfo) -> Void
        init(_ handler: @escaping (DBusMessageInfo) -> Void) { self.handler = handler }
    }

    /// Emits a signal from one of our objects.
    public func emitSignal(path: String, interface: String, member: String, arguments: [DBusValue]) {
        execute { [self] in
            guard let raw, !closed, DBusNames.isValidPath(path), DBusNames.isValidInterface(interface), DBusNames.isValidMember(member),
                  let message = dbus_message_new_signal(path, interface, member) else { return }
            do {
                try DBusMarshal.append(arguments, to: message)
                dbus_connection_send(raw, message, nil)
            } catch {
                logger.error("signal \(interface).\(member): \(error)")
            }
            dbus_message_unref(message)
        }
    }

    /// `org.freedesktop.DBus.Properties.PropertiesChanged` with explicit values.
    public func emitPropertiesChanged(path: String, interface: String, changed: [(String, DBusValue)], invalidated: [String] = []) {
        emitSignal(path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
                   arguments: [.string(interface), .properties(changed), .strings(invalidated)])
    }

    /// `org.freedesktop.DBus.Properties.PropertiesChanged` with the current
    /// values of `names`, read through the exported getters on the
    /// connection's thread (at once when called there, else when it gets to it).
    public func emitPropertiesChanged(path: String, interface: String, names: [String]) {
        execute { [self] in
            guard let exported = objects[path]?.first(where: { $0.name == interface }) else { return }
            let changed = names.compactMap { name in exported.properties[name].map { (name, $0.get()) } }
            emitSignal(path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
                       arguments: [.string(interface), .properties(changed), .strings([])])
        }
    }

    // MARK: Exported objects

    /// Runs `work` on the connection's thread and waits for it, so an
    /// export is in place before anyone can call it.
    private func sync(_ work: @escaping @Sendable () -> Void) {
        if thread.isCurrent { return work() }
        let done = DispatchSemaphore(value: 0)
        thread.execute {
            work()
            done.signal()
        }
        done.wait()
    }

    /// Exports an object with `interfaces` (Properties and Introspectable
    /// come with it; ObjectManager where ``exportObjectManager(at:)`` says).
    /// Under an object manager, InterfacesAdded is emitted. In place when
    /// this returns.
    public func export(path: String, interfaces: [DBusInterface]) {
        precondition(DBusNames.isValidPath(path), "invalid object path \(path)")
        let box = InterfacesBox(interfaces)
        sync { [self] in
            objects[path] = box.interfaces
            for manager in managers(of: path) {
                emitSignal(path: manager, interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesAdded",
                           arguments: [.objectPath(path), interfacesAndProperties(box.interfaces)])
            }
        }
    }

    /// Removes an object (InterfacesRemoved under an object manager).
    public func unexport(path: String) {
        sync { [self] in
            guard let removed = objects.removeValue(forKey: path) else { return }
            for manager in managers(of: path) {
                emitSignal(path: manager, interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesRemoved",
                           arguments: [.objectPath(path), .strings(removed.map(\.name))])
            }
        }
    }

    /// Makes `path` an `org.freedesktop.DBus.ObjectManager` for every object below it.
    public func exportObjectManager(at path: String) {
        precondition(DBusNames.isValidPath(path), "invalid object path \(path)")
        sync { [self] in
            objectManagers.insert(path)
            if objects[path] == nil { objects[path] = [] }
        }
    }

    private final class InterfacesBox: @unchecked Sendable {
        let interfaces: [DBusInterface]
        init(_ interfaces: [DBusInterface]) { self.interfaces = interfaces }
    }

    private func managers(of path: String) -> [String] {
        objectManagers.filter { manager in path != manager && (manager == "/" || path.hasPrefix(manager + "/")) }
    }

    private func interfacesAndProperties(_ interfaces: [DBusInterface]) -> DBusValue {
        .dictionary(key: "s", value: "a{sv}", interfaces.map { DBusEntry(.string($0.name), $0.allProperties()) })
    }

    // MARK: Thread internals

    private func pollSources() -> [DBusThread.Watch] {
        var sources: [DBusThread.Watch] = []
        for watch in watches where dbus_watch_get_enabled(watch) != 0 {
            let flags = dbus_watch_get_flags(watch)
            var events: Int16 = 0
            if flags & DBUS_WATCH_READABLE.rawValue != 0 { events |= Int16(POLLIN) }
            if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { events |= Int16(POLLOUT) }
            sources.append(DBusThread.Watch(fd: dbus_watch_get_unix_fd(watch), events: events) { [unowned self] revents in
                // The watch may have been removed by an earlier handler this round.
                guard watches.contains(watch) else { return }
                var condition: UInt32 = 0
                if revents & Int16(POLLIN) != 0 { condition |= DBUS_WATCH_READABLE.rawValue }
                if revents & Int16(POLLOUT) != 0 { condition |= DBUS_WATCH_WRITABLE.rawValue }
                if revents & Int16(POLLHUP) != 0 { condition |= DBUS_WATCH_HANGUP.rawValue }
                if revents & Int16(POLLERR) != 0 { condition |= DBUS_WATCH_ERROR.rawValue }
                dbus_watch_handle(watch, condition)
            })
        }
        return sources
    }

    private func afterRound() {
        let now = ContinuousClock.now
        for entry in timeouts where entry.deadline <= now && dbus_timeout_get_enabled(entry.timeout) != 0 {
            if let index = timeouts.firstIndex(where: { $0.timeout == entry.timeout }) {
                timeouts[index].deadline = now + .milliseconds(Int(dbus_timeout_get_interval(entry.timeout)))
            }
            dbus_timeout_handle(entry.timeout)
        }
        guard let raw else { return }
        dbus_connection_ref(raw)
        defer { dbus_connection_unref(raw) }
        while dbus_connection_get_dispatch_status(raw) == DBUS_DISPATCH_DATA_REMAINS {
            dbus_connection_dispatch(raw)
            if self.raw == nil { break }
        }
    }

    /// Sends `message` (from any thread) and drops our reference to it.
    func sendReleasing(_ message: OpaquePointer) {
        let box = MessageBox(message)
        execute { [self] in
            if let raw, !closed { dbus_connection_send(raw, box.message, nil) }
            dbus_message_unref(box.message)
        }
    }

    // libdbus messages are refcounted atomically once threads are initialised.
    private struct MessageBox: @unchecked Sendable {
        let message: OpaquePointer
        init(_ message: OpaquePointer) { self.message = message }
    }

    private func failPending(_ failure: DBusFailure) {
        let entries = pending
        pending.removeAll()
        for entry in entries.values {
            thread.cancel(entry.timer)
            entry.handler(.failure(failure))
        }
    }

    private static func string(_ pointer: UnsafePointer<CChar>?) -> String? { pointer.map { String(cString: $0) } }

    private static func failure(from error: inout CDBus.DBusError, fallback: String) -> DBusFailure {
        if dbus_error_is_set(&error) != 0 {
            return DBusFailure(string(error.name) ?? DBusFailure.failed, string(error.message) ?? fallback)
        }
        return DBusFailure(DBusFailure.failed, fallback)
    }

    private func info(_ message: OpaquePointer, kind: DBusMessageInfo.Kind) -> DBusMessageInfo {
        DBusMessageInfo(
            kind: kind, path: Self.string(dbus_message_get_path(message)), interface: Self.string(dbus_message_get_interface(message)),
            member: Self.string(dbus_message_get_member(message)), sender: Self.string(dbus_message_get_sender(message)),
            destination: Self.string(dbus_message_get_destination(message)), errorName: Self.string(dbus_message_get_error_name(message)),
            arguments: DBusMarshal.read(message)
        )
    }

    private func filter(_ message: OpaquePointer) -> DBusHandlerResult {
        switch dbus_message_get_type(message) {
        case DBUS_MESSAGE_TYPE_METHOD_RETURN, DBUS_MESSAGE_TYPE_ERROR:
            guard let entry = pending.removeValue(forKey: dbus_message_get_reply_serial(message)) else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
            thread.cancel(entry.timer)
            if dbus_message_get_type(message) == DBUS_MESSAGE_TYPE_ERROR {
                let arguments = DBusMarshal.read(message)
                entry.handler(.failure(DBusFailure(Self.string(dbus_message_get_error_name(message)) ?? DBusFailure.failed, arguments.first?.stringValue ?? "")))
            } else {
                entry.handler(.success(DBusMarshal.read(message)))
            }
            return DBUS_HANDLER_RESULT_HANDLED
        case DBUS_MESSAGE_TYPE_SIGNAL:
            if dbus_message_is_signal(message, "org.freedesktop.DBus.Local", "Disconnected") != 0 {
                guard !closed else { return DBUS_HANDLER_RESULT_HANDLED }
                closed = true
                logger.notice("D-Bus connection to \(address) lost")
                failPending(DBusFailure(DBusFailure.disconnected, "the bus went away"))
                onDisconnect?()
                return DBUS_HANDLER_RESULT_HANDLED
            }
            let signal = info(message, kind: .signal)
            for (_, entry) in matches.sorted(by: { $0.key < $1.key }) where entry.rule.matches(signal) {
                entry.handler(signal)
            }
            return DBUS_HANDLER_RESULT_HANDLED
        case DBUS_MESSAGE_TYPE_METHOD_CALL:
            handleCall(message)
            return DBUS_HANDLER_RESULT_HANDLED
        default:
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
    }

    private func handleCall(_ message: OpaquePointer) {
        let path = Self.string(dbus_message_get_path(message)) ?? "/"
        let interface = Self.string(dbus_message_get_interface(message)) ?? ""
        let member = Self.string(dbus_message_get_member(message)) ?? ""
        let call = DBusMethodCall(message: message, connection: self, path: path, interface: interface, member: member,
                                  sender: Self.string(dbus_message_get_sender(message)) ?? "", arguments: DBusMarshal.read(message))
        switch interface {
        case "org.freedesktop.DBus.Introspectable" where member == "Introspect":
            return call.reply([.string(introspect(path))])
        case "org.freedesktop.DBus.Peer":
            if member == "Ping" { return call.reply() }
            if member == "GetMachineId" { return call.reply([.string(Self.machineID)]) }
        default:
            break
        }
        guard let interfaces = objects[path] else {
            return call.fail(DBusFailure.unknownObject, "no object at \(path)")
        }
        switch interface {
        case "org.freedesktop.DBus.Properties":
            return handleProperties(call, interfaces: interfaces)
        case "org.freedesktop.DBus.ObjectManager" where objectManagers.contains(path):
            guard member == "GetManagedObjects" else { break }
            let managed = objects.filter { $0.key != path && (path == "/" || $0.key.hasPrefix(path + "/")) && !$0.value.isEmpty }
                .sorted { $0.key < $1.key }
                .map { DBusEntry(.objectPath($0.key), interfacesAndProperties($0.value)) }
            return call.reply([.dictionary(key: "o", value: "a{sa{sv}}", managed)])
        default:
            // An empty interface name is allowed by the spec: the first one with the method.
            let target = interface.isEmpty ? interfaces.first { $0.methods[member] != nil } : interfaces.first { $0.name == interface }
            guard let target else { return call.fail(DBusFailure.unknownInterface, "\(path) has no interface \(interface)") }
            guard let method = target.methods[member] else { return call.fail(DBusFailure.unknownMethod, "\(interface) has no method \(member)") }
            let signature = call.arguments.map(\.signature).joined()
            guard signature == method.inSignature else {
                return call.fail(DBusFailure.invalidArgs, "\(member) takes (\(method.inSignature)), got (\(signature))")
            }
            return method.handler(call)
        }
        call.fail(DBusFailure.unknownMethod, "\(interface).\(member) is not here")
    }

    private func handleProperties(_ call: DBusMethodCall, interfaces: [DBusInterface]) {
        let interfaceName = call.arguments.first?.stringValue ?? ""
        let target = interfaces.first { $0.name == interfaceName }
        switch call.member {
        case "GetAll":
            // An unknown interface has no properties (what sd-bus and GDBus answer too).
            call.reply([target?.allProperties() ?? .properties([])])
        case "Get":
            guard call.arguments.count == 2, let name = call.arguments[1].stringValue else { return call.fail(DBusFailure.invalidArgs, "Get takes (ss)") }
            guard let property = target?.properties[name] else { return call.fail(DBusFailure.unknownProperty, "no property \(interfaceName).\(name)") }
            call.reply([.variant(property.get())])
        case "Set":
            guard call.arguments.count == 3, let name = call.arguments[1].stringValue else { return call.fail(DBusFailure.invalidArgs, "Set takes (ssv)") }
            guard let property = target?.properties[name] else { return call.fail(DBusFailure.unknownProperty, "no property \(interfaceName).\(name)") }
            guard let set = property.set else { return call.fail(DBusFailure.propertyReadOnly, "\(interfaceName).\(name) is read-only") }
            let value = call.arguments[2].unwrapped
            guard value.signature == property.signature else { return call.fail(DBusFailure.invalidArgs, "\(name) is \(property.signature), got \(value.signature)") }
            do {
                try set(value)
                call.reply()
            } catch let failure as DBusFailure {
                call.fail(failure)
            } catch {
                call.fail(DBusFailure.failed, "\(error)")
            }
        default:
            call.fail(DBusFailure.unknownMethod, "Properties has no method \(call.member)")
        }
    }

    private static let machineID: String = {
        (try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "00000000000000000000000000000000"
    }()

    private func introspect(_ path: String) -> String {
        var xml = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>

        """
        if let interfaces = objects[path] {
            xml += """
              <interface name="org.freedesktop.DBus.Introspectable"><method name="Introspect"><arg name="xml" type="s" direction="out"/></method></interface>
              <interface name="org.freedesktop.DBus.Properties">
                <method name="Get"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="out"/></method>
                <method name="GetAll"><arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/></method>
                <method name="Set"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="in"/></method>
                <signal name="PropertiesChanged"><arg name="interface" type="s"/><arg name="changed" type="a{sv}"/><arg name="invalidated" type="as"/></signal>
              </interface>

            """
            if objectManagers.contains(path) {
                xml += """
                  <interface name="org.freedesktop.DBus.ObjectManager">
                    <method name="GetManagedObjects"><arg name="objects" type="a{oa{sa{sv}}}" direction="out"/></method>
                    <signal name="InterfacesAdded"><arg name="object" type="o"/><arg name="interfaces" type="a{sa{sv}}"/></signal>
                    <signal name="InterfacesRemoved"><arg name="object" type="o"/><arg name="interfaces" type="as"/></signal>
                  </interface>

                """
            }
            for interface in interfaces {
                xml += "  <interface name=\"\(interface.name)\">\n"
                for (name, method) in interface.methods.sorted(by: { $0.key < $1.key }) {
                    xml += "    <method name=\"\(name)\">"
                    for type in Self.splitSignature(method.inSignature) { xml += "<arg type=\"\(type)\" direction=\"in\"/>" }
                    for type in Self.splitSignature(method.outSignature) { xml += "<arg type=\"\(type)\" direction=\"out\"/>" }
                    xml += "</method>\n"
                }
                for (name, signature) in interface.signals.sorted(by: { $0.key < $1.key }) {
                    xml += "    <signal name=\"\(name)\">"
                    for type in Self.splitSignature(signature) { xml += "<arg type=\"\(type)\"/>" }
                    xml += "</signal>\n"
                }
                for name in interface.propertyNames {
                    guard let property = interface.properties[name] else { continue }
                    xml += "    <property name=\"\(name)\" type=\"\(property.signature)\" access=\"\(property.set == nil ? "read" : "readwrite")\"/>\n"
                }
                xml += "  </interface>\n"
            }
        }
        let prefix = path == "/" ? "/" : path + "/"
        var children = Set<String>()
        for objectPath in objects.keys where objectPath.hasPrefix(prefix) && objectPath != path {
            if let child = objectPath.dropFirst(prefix.count).split(separator: "/").first { children.insert(String(child)) }
        }
        for child in children.sorted() { xml += "  <node name=\"\(child)\"/>\n" }
        return xml + "</node>\n"
    }

    /// Splits a signature into its complete types.
    static func splitSignature(_ signature: String) -> [String] {
        var result: [String] = []
        var iterator = DBusSignatureIter()
        guard !signature.isEmpty, dbus_signature_validate(signature, nil) != 0 else { return [] }
        signature.withCString { cString in
            dbus_signature_iter_init(&iterator, cString)
            repeat {
                if let single = dbus_signature_iter_get_signature(&iterator) {
                    result.append(String(cString: single))
                    dbus_free(single)
                }
            } while dbus_signature_iter_next(&iterator) != 0
        }
        return result
    }
}
