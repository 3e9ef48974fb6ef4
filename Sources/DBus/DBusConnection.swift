#if canImport(Glibc)
import Glibc
#endif
import CDBus
import Logging
import Reactor

/// A private connection to a message bus over libdbus-1, driven by an
/// ``EventLoop``: libdbus's watches are loop registrations, its timeouts are
/// loop timers, and dispatch runs on the loop. Every public method is safe
/// from any thread; handlers, replies and completions run on the loop.
///
/// The loop should be the connection's own (the daemon gives D-Bus a loop
/// thread of its own, so bus traffic never delays a central's frames); a
/// loop may carry several connections (tests put a client and a server on
/// one).
public final class DBusConnection: @unchecked Sendable {
    // Loop-confined: everything mutable is used on `loop` only (other
    // threads hop with `execute`), which makes the unchecked Sendable sound.
    // libdbus itself is initialised for threads (dbus_threads_init_default)
    // because method-call objects may be released on other threads.
    var raw: OpaquePointer?
    public let loop: EventLoop
    let logger: Logger
    /// Our unique name on the bus (`:1.42`).
    public let uniqueName: String
    /// The address we connected to.
    public let address: String

    private var watches: [OpaquePointer: LoopToken] = [:]
    private var timeouts: [OpaquePointer: LoopToken] = [:]
    private var pending: [UInt32: (handler: (Result<[DBusValue], DBusFailure>) -> Void, timer: LoopToken)] = [:]
    private var matches: [UInt64: (rule: DBusMatchRule, handler: (DBusMessageInfo) -> Void)] = [:]
    var objects: [String: [DBusInterface]] = [:]
    var objectManagers: Set<String> = []
    var closed = false
    private var dispatchScheduled = false
    private let handlerLock = Lock()
    private var nextMatchID: UInt64 = 0
    private var disconnectHandler: (@Sendable () -> Void)?
    private var callerFilter: (@Sendable (String) -> Bool)?
    /// Calls to exported objects refused by ``acceptCaller`` (loop-confined).
    public internal(set) var deniedCalls = 0
    /// Signals that matched a rule in all but their sender: sent by someone
    /// other than the rule's sender, and dropped (loop-confined).
    public private(set) var deniedSignals = 0
    /// The current unique owner of each well-known name a match rule names as
    /// its sender (loop-confined; absent: no owner, or not known yet).
    private var owners: [String: String] = [:]
    private var trackedNames: Set<String> = []
    private var refusedSignalHandler: (@Sendable (DBusMessageInfo) -> Void)?

    /// The bus went away (daemon stopped, socket closed). Runs on the loop, once.
    public var onDisconnect: (@Sendable () -> Void)? {
        get { handlerLock.withLock { disconnectHandler } }
        set { handlerLock.withLock { disconnectHandler = newValue } }
    }

    /// Told (on the loop) of each signal dropped because its sender is not
    /// the one its rule names: someone on the bus is impersonating the bus
    /// daemon or a service.
    public var onRefusedSignal: (@Sendable (DBusMessageInfo) -> Void)? {
        get { handlerLock.withLock { refusedSignalHandler } }
        set { handlerLock.withLock { refusedSignalHandler = newValue } }
    }

    /// Decides which callers may call methods on exported objects (by their
    /// unique bus name); the others get `org.freedesktop.DBus.Error.AccessDenied`.
    /// Introspection and Peer stay open. nil: everyone.
    public var acceptCaller: (@Sendable (String) -> Bool)? {
        get { handlerLock.withLock { callerFilter } }
        set { handlerLock.withLock { callerFilter = newValue } }
    }

    /// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket.
    public static var systemBusAddress: String {
        if let pointer = getenv("DBUS_SYSTEM_BUS_ADDRESS") {
            let address = String(cString: pointer)
            if !address.isEmpty { return address }
        }
        return "unix:path=/var/run/dbus/system_bus_socket"
    }

    /// Connects to the system bus (honouring `DBUS_SYSTEM_BUS_ADDRESS`).
    public static func system(loop: EventLoop, logger: Logger) throws -> DBusConnection {
        try DBusConnection(address: systemBusAddress, loop: loop, logger: logger)
    }

    /// Opens a private connection to the bus at `address` and says Hello
    /// (blocking the caller for at most the bus's reply), then hands the
    /// connection to `loop` (already started). Callable on the loop or off it.
    public init(address: String, loop: EventLoop, logger: Logger) throws {
        dbus_threads_init_default()
        self.address = address
        self.logger = logger
        self.loop = loop
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
        let box = UncheckedBox(connection)
        let attach: @Sendable () -> Void = { [self] in attachToLoop(box.value) }
        if loop.inLoop { attach() } else { try loop.submitAndWait(attach) }
    }

    deinit {
        if let raw {
            dbus_connection_close(raw)
            dbus_connection_unref(raw)
        }
    }

    /// Closes the connection. Pending calls fail. From any thread.
    public func close() {
        execute { [self] in
            guard !closed else { return }
            closed = true
            failPending(DBusFailure(DBusFailure.disconnected, "connection closed"))
            detachFromLoop()
        }
    }

    /// Runs `work` on the loop (at once when already there).
    public func execute(_ work: @escaping @Sendable () -> Void) {
        if loop.inLoop { work() } else { loop.execute(work) }
    }

    // MARK: Calls

    /// How long a call waits for its reply unless told otherwise: ample
    /// for a local service that is not busy (bluetoothd answers in
    /// milliseconds).
    public static let defaultTimeout: Duration = .seconds(5)

    /// Calls a method; `completion` runs on the loop with the out arguments
    /// or the error (a timeout is `NoReply`).
    public func call(destination: String, path: String, interface: String, method: String, arguments: [DBusValue] = [], timeout: Duration = DBusConnection.defaultTimeout, completion: @escaping @Sendable (Result<[DBusValue], DBusFailure>) -> Void) {
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
            let timer = loop.schedule(after: timeout) { [weak self] in
                guard let self, let entry = self.pending.removeValue(forKey: serial) else { return }
                entry.handler(.failure(DBusFailure(DBusFailure.noReply, "\(interface).\(method) on \(destination) timed out")))
            }
            pending[serial] = (completion, timer)
        }
    }

    /// Calls a method and waits for the answer (never on the loop).
    public func callAndWait(destination: String, path: String, interface: String, method: String, arguments: [DBusValue] = [], timeout: Duration = DBusConnection.defaultTimeout) throws -> [DBusValue] {
        precondition(!loop.inLoop, "callAndWait on the connection's loop would deadlock")
        let promise = Promise<Result<[DBusValue], DBusFailure>>()
        call(destination: destination, path: path, interface: interface, method: method, arguments: arguments, timeout: timeout) { result in
            promise.fulfil(result)
        }
        return try promise.wait().get()
    }

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
        let id = handlerLock.withLock { () -> UInt64 in
            nextMatchID += 1
            return nextMatchID
        }
        let box = UncheckedBox(handler)
        execute { [self] in
            matches[id] = (rule, box.value)
            if let name = rule.namesWellKnownSender { trackOwner(of: name) }
            addBusMatch(rule)
        }
        return id
    }

    private func addBusMatch(_ rule: DBusMatchRule) {
        call(destination: DBusMatchRule.bus, path: "/org/freedesktop/DBus", interface: DBusMatchRule.bus, method: "AddMatch", arguments: [.string(rule.text)]) { [logger] result in
            if case .failure(let error) = result { logger.warning("AddMatch \(rule.text): \(error)") }
        }
    }

    /// Learns who owns `name` and follows it from the bus's NameOwnerChanged
    /// (on the loop). The match goes to the bus before GetNameOwner, so the
    /// reply is the state at that moment and every later change arrives
    /// after it: one connection's messages are delivered in order.
    private func trackOwner(of name: String) {
        guard trackedNames.insert(name).inserted else { return }
        addBusMatch(DBusMatchRule(sender: DBusMatchRule.bus, interface: DBusMatchRule.bus, member: "NameOwnerChanged", arg0: name))
        call(destination: DBusMatchRule.bus, path: "/org/freedesktop/DBus", interface: DBusMatchRule.bus, method: "GetNameOwner", arguments: [.string(name)]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success(let values): self.owners[name] = values.first?.stringValue
            case .failure: self.owners[name] = nil
            }
        }
    }

    /// The unique name that owns `name` as far as this connection knows
    /// (only names a match rule names as its sender are followed). On the loop.
    public func knownOwner(of name: String) -> String? {
        precondition(loop.inLoop, "owners are loop-confined")
        return owners[name]
    }

    public func removeMatch(_ id: UInt64) {
        execute { [self] in
            guard let entry = matches.removeValue(forKey: id) else { return }
            call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", method: "RemoveMatch", arguments: [.string(entry.rule.text)]) { _ in }
        }
    }

    /// Emits a signal from one of our objects.
    /// `destination` makes it unicast (to one connection) rather than broadcast.
    public func emitSignal(path: String, interface: String, member: String, arguments: [DBusValue], destination: String? = nil) {
        execute { [self] in
            guard let raw, !closed, DBusNames.isValidPath(path), DBusNames.isValidInterface(interface), DBusNames.isValidMember(member),
                  let message = dbus_message_new_signal(path, interface, member) else { return }
            if let destination {
                guard DBusNames.isValidBusName(destination), dbus_message_set_destination(message, destination) != 0 else {
                    dbus_message_unref(message)
                    return
                }
            }
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
    /// values of `names`, read through the exported getters on the loop.
    public func emitPropertiesChanged(path: String, interface: String, names: [String]) {
        execute { [self] in
            guard let exported = objects[path]?.first(where: { $0.name == interface }) else { return }
            let changed = names.compactMap { name in exported.properties[name].map { (name, $0.get()) } }
            emitSignal(path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged",
                       arguments: [.string(interface), .properties(changed), .strings([])])
        }
    }

    /// Runs `work` on the loop and waits for it (at once when on the loop),
    /// so an export is in place before anyone can call it.
    func sync(_ work: @escaping @Sendable () -> Void) {
        if loop.inLoop { return work() }
        _ = try? loop.submitAndWait(work)
    }

    // MARK: Loop integration

    private var context: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    private static func this(_ data: UnsafeMutableRawPointer?) -> DBusConnection {
        Unmanaged<DBusConnection>.fromOpaque(data!).takeUnretainedValue()
    }

    private func attachToLoop(_ connection: OpaquePointer) {
        dbus_connection_set_watch_functions(connection, { watch, data in
            guard let watch else { return 0 }
            DBusConnection.this(data).updateWatch(watch)
            return 1
        }, { watch, data in
            guard let watch else { return }
            DBusConnection.this(data).removeWatch(watch)
        }, { watch, data in
            guard let watch else { return }
            DBusConnection.this(data).updateWatch(watch)
        }, context, nil)
        dbus_connection_set_timeout_functions(connection, { timeout, data in
            guard let timeout else { return 0 }
            DBusConnection.this(data).updateTimeout(timeout)
            return 1
        }, { timeout, data in
            guard let timeout else { return }
            DBusConnection.this(data).removeTimeout(timeout)
        }, { timeout, data in
            guard let timeout else { return }
            DBusConnection.this(data).updateTimeout(timeout)
        }, context, nil)
        dbus_connection_set_dispatch_status_function(connection, { _, status, data in
            // Called from inside libdbus: dispatch later, from the loop's top.
            if status == DBUS_DISPATCH_DATA_REMAINS { DBusConnection.this(data).scheduleDispatch() }
        }, context, nil)
        dbus_connection_add_filter(connection, { _, message, data in
            guard let message else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
            return DBusConnection.this(data).filter(message)
        }, context, nil)
        // Hello's reply may have brought more messages along.
        scheduleDispatch()
    }

    private func detachFromLoop() {
        for token in watches.values { loop.unregister(token) }
        for token in timeouts.values { loop.cancel(token) }
        watches.removeAll()
        timeouts.removeAll()
        if let raw {
            dbus_connection_set_watch_functions(raw, nil, nil, nil, nil, nil)
            dbus_connection_set_timeout_functions(raw, nil, nil, nil, nil, nil)
            dbus_connection_set_dispatch_status_function(raw, nil, nil, nil)
            dbus_connection_close(raw)
            dbus_connection_unref(raw)
            self.raw = nil
        }
    }

    private func updateWatch(_ watch: OpaquePointer) {
        var interest: EventLoop.Interest = .none
        if dbus_watch_get_enabled(watch) != 0 {
            let flags = dbus_watch_get_flags(watch)
            if flags & DBUS_WATCH_READABLE.rawValue != 0 { interest.insert(.readable) }
            if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { interest.insert(.writable) }
        }
        if let token = watches[watch] {
            loop.setInterest(token, interest)
            return
        }
        do {
            watches[watch] = try loop.register(dbus_watch_get_unix_fd(watch), interest: interest) { [unowned self] readiness in
                handleWatch(watch, readiness)
            }
        } catch {
            logger.error("D-Bus watch on \(address): \(error)")
        }
    }

    private func removeWatch(_ watch: OpaquePointer) {
        if let token = watches.removeValue(forKey: watch) { loop.unregister(token) }
    }

    private func handleWatch(_ watch: OpaquePointer, _ readiness: EventLoop.Readiness) {
        // The watch may have been removed by an earlier handler this round.
        guard watches[watch] != nil else { return }
        var condition: UInt32 = 0
        if readiness.contains(.readable) { condition |= DBUS_WATCH_READABLE.rawValue }
        if readiness.contains(.writable) { condition |= DBUS_WATCH_WRITABLE.rawValue }
        if readiness.contains(.closed) { condition |= DBUS_WATCH_HANGUP.rawValue }
        dbus_watch_handle(watch, condition)
        dispatchAll()
    }

    private func updateTimeout(_ timeout: OpaquePointer) {
        if let token = timeouts.removeValue(forKey: timeout) { loop.cancel(token) }
        guard dbus_timeout_get_enabled(timeout) != 0 else { return }
        let interval = Duration.milliseconds(Int(dbus_timeout_get_interval(timeout)))
        timeouts[timeout] = loop.schedule(after: interval) { [unowned self] in
            guard timeouts.removeValue(forKey: timeout) != nil else { return }
            // libdbus timeouts repeat until removed or disabled.
            updateTimeout(timeout)
            dbus_timeout_handle(timeout)
            dispatchAll()
        }
    }

    private func removeTimeout(_ timeout: OpaquePointer) {
        if let token = timeouts.removeValue(forKey: timeout) { loop.cancel(token) }
    }

    private func scheduleDispatch() {
        guard !dispatchScheduled else { return }
        dispatchScheduled = true
        loop.execute { [weak self] in
            guard let self else { return }
            self.dispatchScheduled = false
            self.dispatchAll()
        }
    }

    private func dispatchAll() {
        guard let raw else { return }
        dbus_connection_ref(raw)
        defer { dbus_connection_unref(raw) }
        while dbus_connection_get_dispatch_status(raw) == DBUS_DISPATCH_DATA_REMAINS {
            dbus_connection_dispatch(raw)
            if self.raw == nil { break }
        }
    }

    /// Keeps ``owners`` current, before any handler sees the signal, from
    /// NameOwnerChanged as the bus daemon itself sent it (a unicast copy
    /// from anyone else is not the bus's word).
    private func noteOwnerChange(_ signal: DBusMessageInfo) {
        guard signal.sender == DBusMatchRule.bus, signal.interface == DBusMatchRule.bus, signal.member == "NameOwnerChanged",
              signal.arguments.count == 3, let name = signal.arguments[0].stringValue, trackedNames.contains(name),
              let new = signal.arguments[2].stringValue else { return }
        owners[name] = new.isEmpty ? nil : new
    }

    /// Sends `message` (from any thread) and drops our reference to it.
    func sendReleasing(_ message: OpaquePointer) {
        let box = UncheckedBox(message)
        execute { [self] in
            if let raw, !closed { dbus_connection_send(raw, box.value, nil) }
            dbus_message_unref(box.value)
        }
    }

    private func failPending(_ failure: DBusFailure) {
        let entries = pending
        pending.removeAll()
        for entry in entries.values {
            loop.cancel(entry.timer)
            entry.handler(.failure(failure))
        }
    }

    static func string(_ pointer: UnsafePointer<CChar>?) -> String? { pointer.map { String(cString: $0) } }

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
            loop.cancel(entry.timer)
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
                let handler = onDisconnect
                // Leave libdbus's dispatch before tearing the connection down.
                loop.execute { [self] in
                    detachFromLoop()
                    handler?()
                }
                return DBUS_HANDLER_RESULT_HANDLED
            }
            let signal = info(message, kind: .signal)
            noteOwnerChange(signal)
            var refused = false
            for (_, entry) in matches.sorted(by: { $0.key < $1.key }) {
                switch entry.rule.verdict(signal, owner: { self.owners[$0] }) {
                case .matches: entry.handler(signal)
                case .wrongSender: refused = true
                case .differs: break
                }
            }
            if refused {
                deniedSignals += 1
                onRefusedSignal?(signal)
            }
            return DBUS_HANDLER_RESULT_HANDLED
        case DBUS_MESSAGE_TYPE_METHOD_CALL:
            handleCall(message)
            return DBUS_HANDLER_RESULT_HANDLED
        default:
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        }
    }
}

/// Carries a value the compiler cannot prove Sendable across a hop to the
/// loop, where it is used alone (a handler closure, a refcounted libdbus
/// message). One audited place instead of a box type per use.
struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
