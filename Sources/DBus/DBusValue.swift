/// One D-Bus value with its type: everything BlueZ's interfaces use (basic
/// types, arrays, dictionaries, structs, variants, object paths, Unix file
/// descriptors).
public indirect enum DBusValue: Sendable, Equatable, CustomStringConvertible {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    /// A file descriptor. Sending passes a duplicate (the caller keeps its
    /// own); a received one is owned by whoever takes it out of the message.
    case unixFD(Int32)
    /// `ay`, kept as bytes: a GATT value, and the one array a caller can
    /// make large (16 MB as one enum case per byte was half a gigabyte).
    case bytes([UInt8])
    /// `a<element>`: the element signature is needed for an empty array.
    case array(element: String, [DBusValue])
    /// `a{<key><value>}`; entries keep their order.
    case dictionary(key: String, value: String, [DBusEntry])
    case structure([DBusValue])
    case variant(DBusValue)

    /// The D-Bus type signature of this value.
    public var signature: String {
        switch self {
        case .byte: return "y"
        case .bool: return "b"
        case .int16: return "n"
        case .uint16: return "q"
        case .int32: return "i"
        case .uint32: return "u"
        case .int64: return "x"
        case .uint64: return "t"
        case .double: return "d"
        case .string: return "s"
        case .objectPath: return "o"
        case .signature: return "g"
        case .unixFD: return "h"
        case .bytes: return "ay"
        case .array(let element, _): return "a" + element
        case .dictionary(let key, let value, _): return "a{" + key + value + "}"
        case .structure(let fields): return "(" + fields.map(\.signature).joined() + ")"
        case .variant: return "v"
        }
    }

    public var description: String {
        switch self {
        case .byte(let v): return "\(v)"
        case .bool(let v): return "\(v)"
        case .int16(let v): return "\(v)"
        case .uint16(let v): return "\(v)"
        case .int32(let v): return "\(v)"
        case .uint32(let v): return "\(v)"
        case .int64(let v): return "\(v)"
        case .uint64(let v): return "\(v)"
        case .double(let v): return "\(v)"
        case .string(let v): return "\"\(v)\""
        case .objectPath(let v): return v
        case .signature(let v): return "<\(v)>"
        case .unixFD(let v): return "fd \(v)"
        case .bytes(let v): return "[" + v.map { "\($0)" }.joined(separator: ", ") + "]"
        case .array(_, let items): return "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .dictionary(_, _, let entries): return "{" + entries.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        case .structure(let fields): return "(" + fields.map(\.description).joined(separator: ", ") + ")"
        case .variant(let inner): return "<\(inner)>"
        }
    }
}

/// One entry of a D-Bus dictionary.
public struct DBusEntry: Sendable, Equatable {
    public var key: DBusValue
    public var value: DBusValue
    public init(_ key: DBusValue, _ value: DBusValue) {
        self.key = key
        self.value = value
    }
}

extension DBusValue {
    /// `as`.
    public static func strings(_ strings: [String]) -> DBusValue {
        .array(element: "s", strings.map { .string($0) })
    }

    /// `a{sv}`, the property bag and options dictionary of most interfaces.
    public static func properties(_ values: [(String, DBusValue)]) -> DBusValue {
        .dictionary(key: "s", value: "v", values.map { DBusEntry(.string($0.0), .variant($0.1)) })
    }

    /// The value inside any number of variant wrappers.
    public var unwrapped: DBusValue {
        if case .variant(let inner) = self { return inner.unwrapped }
        return self
    }

    public var stringValue: String? {
        switch unwrapped {
        case .string(let s), .objectPath(let s), .signature(let s): return s
        default: return nil
        }
    }

    public var boolValue: Bool? {
        if case .bool(let b) = unwrapped { return b }
        return nil
    }

    public var integerValue: Int? {
        switch unwrapped {
        case .byte(let v): return Int(v)
        case .int16(let v): return Int(v)
        case .uint16(let v): return Int(v)
        case .int32(let v): return Int(v)
        case .uint32(let v): return Int(v)
        case .int64(let v): return Int(v)
        case .uint64(let v): return Int(clamping: v)
        default: return nil
        }
    }

    /// The bytes of an `ay`.
    public var byteArray: [UInt8]? {
        if case .bytes(let bytes) = unwrapped { return bytes }
        guard case .array(_, let items) = unwrapped else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(items.count)
        for item in items {
            guard case .byte(let b) = item else { return nil }
            bytes.append(b)
        }
        return bytes
    }

    /// The items of any array.
    public var arrayValue: [DBusValue]? {
        if case .array(_, let items) = unwrapped { return items }
        if case .bytes(let bytes) = unwrapped { return bytes.map { .byte($0) } }
        return nil
    }

    /// A dictionary with string (or object path) keys, such as `a{sv}` or
    /// `a{oa{sa{sv}}}`; variant values are kept as they are.
    public var dictionaryValue: [String: DBusValue]? {
        guard case .dictionary(_, _, let entries) = unwrapped else { return nil }
        var result: [String: DBusValue] = [:]
        for entry in entries {
            guard let key = entry.key.stringValue else { return nil }
            result[key] = entry.value
        }
        return result
    }
}
