import CDBus

/// Type codes (dbus-protocol.h spells them as casts, which Swift does not import).
enum DBusType {
    static let byte = Int32(UInt8(ascii: "y"))
    static let bool = Int32(UInt8(ascii: "b"))
    static let int16 = Int32(UInt8(ascii: "n"))
    static let uint16 = Int32(UInt8(ascii: "q"))
    static let int32 = Int32(UInt8(ascii: "i"))
    static let uint32 = Int32(UInt8(ascii: "u"))
    static let int64 = Int32(UInt8(ascii: "x"))
    static let uint64 = Int32(UInt8(ascii: "t"))
    static let double = Int32(UInt8(ascii: "d"))
    static let string = Int32(UInt8(ascii: "s"))
    static let objectPath = Int32(UInt8(ascii: "o"))
    static let signature = Int32(UInt8(ascii: "g"))
    static let unixFD = Int32(UInt8(ascii: "h"))
    static let array = Int32(UInt8(ascii: "a"))
    static let variant = Int32(UInt8(ascii: "v"))
    static let structure = Int32(UInt8(ascii: "r"))
    static let dictEntry = Int32(UInt8(ascii: "e"))
    static let invalid = Int32(0)
}

/// Thrown when a value cannot be written into a message (libdbus aborts the
/// process on malformed input, so everything is checked before it sees it).
public struct DBusMarshalError: Error, CustomStringConvertible {
    public var description: String
}

enum DBusMarshal {
    /// Appends `values` as the message's arguments.
    static func append(_ values: [DBusValue], to message: OpaquePointer) throws {
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(message, &iter)
        for value in values { try append(value, to: &iter) }
    }

    static func append(_ value: DBusValue, to iter: inout DBusMessageIter) throws {
        var ok: dbus_bool_t = 1
        switch value {
        case .byte(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.byte, &x)
        case .bool(let v): var x: dbus_bool_t = v ? 1 : 0; ok = dbus_message_iter_append_basic(&iter, DBusType.bool, &x)
        case .int16(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.int16, &x)
        case .uint16(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.uint16, &x)
        case .int32(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.int32, &x)
        case .uint32(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.uint32, &x)
        case .int64(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.int64, &x)
        case .uint64(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.uint64, &x)
        case .double(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.double, &x)
        case .unixFD(let v): var x = v; ok = dbus_message_iter_append_basic(&iter, DBusType.unixFD, &x)
        case .string(let s):
            // D-Bus strings cannot hold NUL; Swift strings are valid UTF-8.
            ok = appendString(s.contains("\0") ? String(s.filter { $0 != "\0" }) : s, type: DBusType.string, to: &iter)
        case .objectPath(let p):
            guard DBusNames.isValidPath(p) else { throw DBusMarshalError(description: "invalid object path \"\(p)\"") }
            ok = appendString(p, type: DBusType.objectPath, to: &iter)
        case .signature(let g):
            guard dbus_signature_validate(g, nil) != 0 else { throw DBusMarshalError(description: "invalid signature \"\(g)\"") }
            ok = appendString(g, type: DBusType.signature, to: &iter)
        case .bytes(let bytes):
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.array, "y", &sub) != 0 else { throw DBusMarshalError(description: "out of memory") }
            // One copy for byte arrays (characteristic values), not one call per byte.
            ok = bytes.withUnsafeBufferPointer { buffer in
                var base = buffer.baseAddress
                return withUnsafeMutablePointer(to: &base) { dbus_message_iter_append_fixed_array(&sub, DBusType.byte, $0, Int32(buffer.count)) }
            }
            if dbus_message_iter_close_container(&iter, &sub) == 0 { ok = 0 }
        case .array(let element, let items):
            guard dbus_signature_validate_single(element, nil) != 0 else { throw DBusMarshalError(description: "invalid array element signature \"\(element)\"") }
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.array, element, &sub) != 0 else { throw DBusMarshalError(description: "out of memory") }
            for item in items {
                guard item.signature == element else {
                    dbus_message_iter_abandon_container(&iter, &sub)
                    throw DBusMarshalError(description: "array of \(element) holds a \(item.signature)")
                }
                do { try append(item, to: &sub) } catch { dbus_message_iter_abandon_container(&iter, &sub); throw error }
            }
            if dbus_message_iter_close_container(&iter, &sub) == 0 { ok = 0 }
        case .dictionary(let key, let valueSignature, let entries):
            let entrySignature = "{" + key + valueSignature + "}"
            guard dbus_signature_validate_single("a" + entrySignature, nil) != 0 else { throw DBusMarshalError(description: "invalid dictionary signature \(entrySignature)") }
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.array, entrySignature, &sub) != 0 else { throw DBusMarshalError(description: "out of memory") }
            for entry in entries {
                guard entry.key.signature == key, entry.value.signature == valueSignature else {
                    dbus_message_iter_abandon_container(&iter, &sub)
                    throw DBusMarshalError(description: "dictionary \(entrySignature) holds \(entry.key.signature)→\(entry.value.signature)")
                }
                var pair = DBusMessageIter()
                guard dbus_message_iter_open_container(&sub, DBusType.dictEntry, nil, &pair) != 0 else { throw DBusMarshalError(description: "out of memory") }
                do {
                    try append(entry.key, to: &pair)
                    try append(entry.value, to: &pair)
                } catch {
                    dbus_message_iter_abandon_container(&sub, &pair)
                    dbus_message_iter_abandon_container(&iter, &sub)
                    throw error
                }
                dbus_message_iter_close_container(&sub, &pair)
            }
            if dbus_message_iter_close_container(&iter, &sub) == 0 { ok = 0 }
        case .structure(let fields):
            guard !fields.isEmpty else { throw DBusMarshalError(description: "empty struct") }
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.structure, nil, &sub) != 0 else { throw DBusMarshalError(description: "out of memory") }
            for field in fields {
                do { try append(field, to: &sub) } catch { dbus_message_iter_abandon_container(&iter, &sub); throw error }
            }
            if dbus_message_iter_close_container(&iter, &sub) == 0 { ok = 0 }
        case .variant(let inner):
            let innerSignature = inner.signature
            guard dbus_signature_validate_single(innerSignature, nil) != 0 else { throw DBusMarshalError(description: "invalid variant content \(innerSignature)") }
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, DBusType.variant, innerSignature, &sub) != 0 else { throw DBusMarshalError(description: "out of memory") }
            do { try append(inner, to: &sub) } catch { dbus_message_iter_abandon_container(&iter, &sub); throw error }
            if dbus_message_iter_close_container(&iter, &sub) == 0 { ok = 0 }
        }
        if ok == 0 { throw DBusMarshalError(description: "cannot append \(value.signature) (out of memory, or a descriptor that cannot be passed)") }
    }

    private static func appendString(_ s: String, type: Int32, to iter: inout DBusMessageIter) -> dbus_bool_t {
        s.withCString { cString in
            var pointer: UnsafePointer<CChar>? = cString
            return dbus_message_iter_append_basic(&iter, type, &pointer)
        }
    }

    /// All arguments of a message.
    static func read(_ message: OpaquePointer) -> [DBusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(message, &iter) != 0 else { return [] }
        var values: [DBusValue] = []
        while dbus_message_iter_get_arg_type(&iter) != DBusType.invalid {
            if let value = read(&iter) { values.append(value) }
            dbus_message_iter_next(&iter)
        }
        return values
    }

    /// The value at `iter` (nil for an unknown type).
    static func read(_ iter: inout DBusMessageIter) -> DBusValue? {
        let type = dbus_message_iter_get_arg_type(&iter)
        var raw = DBusBasicValue()
        func basic() { dbus_message_iter_get_basic(&iter, &raw) }
        switch type {
        case DBusType.byte: basic(); return .byte(raw.byt)
        case DBusType.bool: basic(); return .bool(raw.bool_val != 0)
        case DBusType.int16: basic(); return .int16(raw.i16)
        case DBusType.uint16: basic(); return .uint16(raw.u16)
        case DBusType.int32: basic(); return .int32(raw.i32)
        case DBusType.uint32: basic(); return .uint32(raw.u32)
        case DBusType.int64: basic(); return .int64(Int64(raw.i64))
        case DBusType.uint64: basic(); return .uint64(UInt64(raw.u64))
        case DBusType.double: basic(); return .double(raw.dbl)
        case DBusType.unixFD: basic(); return .unixFD(raw.fd)
        case DBusType.string: basic(); return .string(raw.str.map { String(cString: $0) } ?? "")
        case DBusType.objectPath: basic(); return .objectPath(raw.str.map { String(cString: $0) } ?? "/")
        case DBusType.signature: basic(); return .signature(raw.str.map { String(cString: $0) } ?? "")
        case DBusType.variant:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return read(&sub).map { .variant($0) }
        case DBusType.structure:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            var fields: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != DBusType.invalid {
                if let field = read(&sub) { fields.append(field) }
                dbus_message_iter_next(&sub)
            }
            return .structure(fields)
        case DBusType.array:
            let signature = currentSignature(&iter)
            let element = String(signature.dropFirst())
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            if element == "y" {
                var pointer: UnsafeMutableRawPointer?
                var count: Int32 = 0
                if dbus_message_iter_get_arg_type(&sub) == DBusType.byte {
                    withUnsafeMutablePointer(to: &pointer) { dbus_message_iter_get_fixed_array(&sub, $0, &count) }
                }
                var bytes = [UInt8](repeating: 0, count: Int(count))
                if count > 0, let pointer { bytes.withUnsafeMutableBytes { $0.copyMemory(from: UnsafeRawBufferPointer(start: pointer, count: Int(count))) } }
                return .bytes(bytes)
            }
            if element.hasPrefix("{") {
                let inner = element.dropFirst().dropLast()
                let keySignature = String(inner.prefix(1))
                let valueSignature = String(inner.dropFirst())
                var entries: [DBusEntry] = []
                while dbus_message_iter_get_arg_type(&sub) == DBusType.dictEntry {
                    var pair = DBusMessageIter()
                    dbus_message_iter_recurse(&sub, &pair)
                    let key = read(&pair)
                    dbus_message_iter_next(&pair)
                    let value = read(&pair)
                    if let key, let value { entries.append(DBusEntry(key, value)) }
                    dbus_message_iter_next(&sub)
                }
                return .dictionary(key: keySignature, value: valueSignature, entries)
            }
            var items: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != DBusType.invalid {
                if let item = read(&sub) { items.append(item) }
                dbus_message_iter_next(&sub)
            }
            return .array(element: element, items)
        default:
            return nil
        }
    }

    private static func currentSignature(_ iter: inout DBusMessageIter) -> String {
        guard let cString = dbus_message_iter_get_signature(&iter) else { return "" }
        defer { dbus_free(cString) }
        return String(cString: cString)
    }
}

/// Checks names before libdbus sees them (it aborts on invalid ones).
public enum DBusNames {
    public static func isValidPath(_ path: String) -> Bool {
        dbus_validate_path(path, nil) != 0
    }

    public static func isValidInterface(_ name: String) -> Bool {
        dbus_validate_interface(name, nil) != 0
    }

    public static func isValidMember(_ name: String) -> Bool {
        dbus_validate_member(name, nil) != 0
    }

    public static func isValidBusName(_ name: String) -> Bool {
        dbus_validate_bus_name(name, nil) != 0
    }

    public static func isValidErrorName(_ name: String) -> Bool {
        dbus_validate_error_name(name, nil) != 0
    }
}
