#if canImport(Glibc)
import Glibc
#endif
import CDBus

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
    public static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
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
/// dispatch use it.
///
/// `sender` is checked here too, not only by the bus: the bus routes a
/// *unicast* signal to its destination whatever that connection's match
/// rules say, and any local user may send one (Debian's system.conf allows
/// every signal). So a rule naming `org.freedesktop.DBus` takes only what
/// the bus daemon itself sent, and a rule naming a well-known name such as
/// `org.bluez` takes only what that name's current owner sent (the
/// connection learns the owner with GetNameOwner and keeps it current from
/// the bus's own NameOwnerChanged).
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

    /// How a signal relates to the rule.
    enum Verdict { case matches, differs, wrongSender }

    /// Whether `message` is one of the rule's signals, and if it is one in
    /// all but its sender, says so: an impostor, counted by the connection.
    /// `owner` maps a well-known name to its current unique owner.
    func verdict(_ message: DBusMessageInfo, owner: (String) -> String?) -> Verdict {
        guard message.kind == .signal else { return .differs }
        if let interface, message.interface != interface { return .differs }
        if let member, message.member != member { return .differs }
        if let path, message.path != path { return .differs }
        if let pathNamespace {
            guard let messagePath = message.path else { return .differs }
            if pathNamespace != "/", messagePath != pathNamespace, !messagePath.hasPrefix(pathNamespace + "/") { return .differs }
        }
        if let arg0, message.arguments.first?.stringValue != arg0 { return .differs }
        guard let sender else { return .matches }
        guard let actual = message.sender else { return .wrongSender }
        // The bus daemon's own messages carry its name as their sender, and
        // no client can take that name or a unique name that is not its own.
        if sender.hasPrefix(":") || sender == DBusMatchRule.bus { return actual == sender ? .matches : .wrongSender }
        guard let current = owner(sender) else { return .wrongSender }
        return actual == current ? .matches : .wrongSender
    }

    /// The bus daemon's name, the sender of NameOwnerChanged.
    public static let bus = "org.freedesktop.DBus"

    /// Whether `sender` is a well-known name whose owner must be tracked.
    var namesWellKnownSender: String? {
        guard let sender, !sender.hasPrefix(":"), sender != DBusMatchRule.bus else { return nil }
        return sender
    }
}
