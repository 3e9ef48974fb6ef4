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

