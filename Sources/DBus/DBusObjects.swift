#if canImport(Glibc)
import Glibc
#endif
import CDBus
import Reactor

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
    private let lock = Lock()
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


/// The object server: exported objects, their Properties, ObjectManager
/// and Introspectable interfaces, and the dispatch of incoming calls.
extension DBusConnection {

    /// Exports an object with `interfaces` (Properties and Introspectable
    /// come with it; ObjectManager where ``exportObjectManager(at:)`` says).
    /// Under an object manager, InterfacesAdded is emitted. In place when
    /// this returns.
    public func export(path: String, interfaces: [DBusInterface]) {
        precondition(DBusNames.isValidPath(path), "invalid object path \(path)")
        let box = UncheckedBox(interfaces)
        sync { [self] in
            objects[path] = box.value
            for manager in managers(of: path) {
                emitSignal(path: manager, interface: "org.freedesktop.DBus.ObjectManager", member: "InterfacesAdded",
                           arguments: [.objectPath(path), interfacesAndProperties(box.value)])
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


    private func managers(of path: String) -> [String] {
        objectManagers.filter { manager in path != manager && (manager == "/" || path.hasPrefix(manager + "/")) }
    }

    private func interfacesAndProperties(_ interfaces: [DBusInterface]) -> DBusValue {
        .dictionary(key: "s", value: "a{sv}", interfaces.map { DBusEntry(.string($0.name), $0.allProperties()) })
    }


    func handleCall(_ message: OpaquePointer) {
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
        if let acceptCaller, !acceptCaller(call.sender) {
            deniedCalls += 1
            return call.fail(DBusFailure.accessDenied, "\(call.sender) may not call \(interface).\(member) here")
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
        Files.text("/etc/machine-id", limit: 4096)?.trimmed ?? "00000000000000000000000000000000"
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
