/// JSON for the control socket and `status --json`, without Foundation: a
/// value tree, a parser with a depth limit, a writer, and Codable encoder and
/// decoder over the tree. Keys keep the order their `CodingKeys` give, so
/// the output is stable without sorting.
public indirect enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    /// A number, kept as its text so integers round-trip exactly.
    case number(String)
    case string(String)
    case array([JSONValue])
    /// Members in order.
    case object([(String, JSONValue)])

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case (.bool(let a), .bool(let b)): return a == b
        case (.number(let a), .number(let b)): return a == b || Double(a) == Double(b)
        case (.string(let a), .string(let b)): return a == b
        case (.array(let a), .array(let b)): return a == b
        case (.object(let a), .object(let b)): return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    /// A member of an object, nil otherwise.
    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }
}

/// Why JSON text could not be read or decoded.
public struct JSONError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

// MARK: Parsing

extension JSONValue {
    /// How deep arrays and objects may nest (control requests are flat; a
    /// status is 3 levels).
    public static let maximumDepth = 64

    /// Parses one JSON value (surrounding whitespace allowed).
    public static func parse<C: Collection>(_ text: C) throws -> JSONValue where C.Element == UInt8 {
        var parser = JSONParser(bytes: Array(text))
        parser.skipSpace()
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.offset == parser.bytes.count else { throw JSONError("unexpected text after the JSON value at byte \(parser.offset)") }
        return value
    }
}

private struct JSONParser {
    let bytes: [UInt8]
    var offset = 0

    mutating func skipSpace() {
        while offset < bytes.count, bytes[offset] == 0x20 || bytes[offset] == 0x0A || bytes[offset] == 0x0D || bytes[offset] == 0x09 { offset += 1 }
    }

    mutating func value(depth: Int) throws -> JSONValue {
        guard depth < JSONValue.maximumDepth else { throw JSONError("nested deeper than \(JSONValue.maximumDepth) levels") }
        guard offset < bytes.count else { throw JSONError("unexpected end of JSON") }
        switch bytes[offset] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        default: return .number(try number())
        }
    }

    mutating func literal(_ word: String) throws {
        let expected = Array(word.utf8)
        guard offset + expected.count <= bytes.count, Array(bytes[offset..<(offset + expected.count)]) == expected else {
            throw JSONError("unexpected character at byte \(offset)")
        }
        offset += expected.count
    }

    mutating func number() throws -> String {
        let start = offset
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "-") { offset += 1 }
        var digits = 0
        while offset < bytes.count {
            let byte = bytes[offset]
            if (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                digits += 1
            } else if byte != UInt8(ascii: ".") && byte != UInt8(ascii: "e") && byte != UInt8(ascii: "E") && byte != UInt8(ascii: "+") && byte != UInt8(ascii: "-") {
                break
            }
            offset += 1
        }
        let text = String(decoding: bytes[start..<offset], as: UTF8.self)
        guard digits > 0, Double(text) != nil else { throw JSONError("not a JSON value at byte \(start)") }
        return text
    }

    mutating func string() throws -> String {
        offset += 1  // opening quote
        var result: [UInt8] = []
        while offset < bytes.count {
            let byte = bytes[offset]
            offset += 1
            switch byte {
            case UInt8(ascii: "\""):
                return String(decoding: result, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard offset < bytes.count else { break }
                let escape = bytes[offset]
                offset += 1
                switch escape {
                case UInt8(ascii: "n"): result.append(0x0A)
                case UInt8(ascii: "t"): result.append(0x09)
                case UInt8(ascii: "r"): result.append(0x0D)
                case UInt8(ascii: "b"): result.append(0x08)
                case UInt8(ascii: "f"): result.append(0x0C)
                case UInt8(ascii: "u"):
                    var code = try hex4()
                    if (0xD800...0xDBFF).contains(code), offset + 1 < bytes.count, bytes[offset] == UInt8(ascii: "\\"), bytes[offset + 1] == UInt8(ascii: "u") {
                        offset += 2
                        let low = try hex4()
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    }
                    let scalar = Unicode.Scalar(code) ?? "\u{FFFD}"
                    result.append(contentsOf: Array(String(Character(scalar)).utf8))
                default: result.append(escape)
                }
            case 0..<0x20:
                throw JSONError("control character in a string at byte \(offset - 1)")
            default:
                result.append(byte)
            }
        }
        throw JSONError("unterminated string")
    }

    mutating func hex4() throws -> UInt32 {
        guard offset + 4 <= bytes.count, let code = UInt32(String(decoding: bytes[offset..<(offset + 4)], as: UTF8.self), radix: 16) else {
            throw JSONError("bad \\u escape at byte \(offset)")
        }
        offset += 4
        return code
    }

    mutating func array(depth: Int) throws -> JSONValue {
        offset += 1
        var items: [JSONValue] = []
        skipSpace()
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "]") {
            offset += 1
            return .array(items)
        }
        while true {
            skipSpace()
            items.append(try value(depth: depth + 1))
            skipSpace()
            guard offset < bytes.count else { throw JSONError("unterminated array") }
            if bytes[offset] == UInt8(ascii: ",") { offset += 1; continue }
            if bytes[offset] == UInt8(ascii: "]") { offset += 1; return .array(items) }
            throw JSONError("expected , or ] at byte \(offset)")
        }
    }

    mutating func object(depth: Int) throws -> JSONValue {
        offset += 1
        var members: [(String, JSONValue)] = []
        skipSpace()
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "}") {
            offset += 1
            return .object(members)
        }
        while true {
            skipSpace()
            guard offset < bytes.count, bytes[offset] == UInt8(ascii: "\"") else { throw JSONError("expected a key at byte \(offset)") }
            let key = try string()
            skipSpace()
            guard offset < bytes.count, bytes[offset] == UInt8(ascii: ":") else { throw JSONError("expected : at byte \(offset)") }
            offset += 1
            skipSpace()
            members.append((key, try value(depth: depth + 1)))
            skipSpace()
            guard offset < bytes.count else { throw JSONError("unterminated object") }
            if bytes[offset] == UInt8(ascii: ",") { offset += 1; continue }
            if bytes[offset] == UInt8(ascii: "}") { offset += 1; return .object(members) }
            throw JSONError("expected , or } at byte \(offset)")
        }
    }
}

// MARK: Writing

extension JSONValue {
    /// The JSON text; `pretty` indents by two spaces, one member a line.
    public func serialized(pretty: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(1024)
        write(into: &out, pretty: pretty, indent: 0)
        return out
    }

    func write(into out: inout [UInt8], pretty: Bool, indent: Int) {
        switch self {
        case .null: out.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
        case .bool(let value): out.append(contentsOf: value ? Array("true".utf8) : Array("false".utf8))
        case .number(let text): out.append(contentsOf: text.utf8)
        case .string(let text): Self.writeString(text, into: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { Self.newline(&out, indent + 1) }
                item.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty, !items.isEmpty { Self.newline(&out, indent) }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (index, (key, value)) in members.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { Self.newline(&out, indent + 1) }
                Self.writeString(key, into: &out)
                out.append(UInt8(ascii: ":"))
                if pretty { out.append(UInt8(ascii: " ")) }
                value.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty, !members.isEmpty { Self.newline(&out, indent) }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static func newline(_ out: inout [UInt8], _ indent: Int) {
        out.append(0x0A)
        for _ in 0..<(indent * 2) { out.append(0x20) }
    }

    /// A JSON string. Besides what JSON requires escaped (C0), DEL and the
    /// C1 controls are too, so `--json` printed on a terminal is as inert
    /// as the text output.
    static func writeString(_ text: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x22: out.append(contentsOf: [0x5C, 0x22])
            case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0..<0x20, 0x7F...0x9F:
                let digits = Array("0123456789abcdef".utf8)
                let value = Int(scalar.value)
                out.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), digits[value >> 4], digits[value & 0xF]])
            case 0x20..<0x7F: out.append(UInt8(scalar.value))
            default: if let encoded = UTF8.encode(scalar) { out.append(contentsOf: encoded) }
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// A number's JSON text: integers without a fraction, others shortest.
    static func numberText(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }
}

// MARK: Codable

/// Encodes `Encodable` values as JSON (keys as the type's CodingKeys say,
/// in their order; nil optionals left out).
public struct JSONEncoderLite {
    public var pretty = false
    public init(pretty: Bool = false) { self.pretty = pretty }

    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        try JSONEncoderLite.value(of: value).serialized(pretty: pretty)
    }

    /// The value tree of `value`.
    public static func value<T: Encodable>(of value: T) throws -> JSONValue {
        let encoder = TreeEncoder(codingPath: [])
        try value.encode(to: encoder)
        return encoder.storage.value
    }
}

/// Decodes `Decodable` values from JSON.
public struct JSONDecoderLite {
    public init() {}

    public func decode<T: Decodable, C: Collection>(_ type: T.Type, from bytes: C) throws -> T where C.Element == UInt8 {
        try T(from: TreeDecoder(value: try JSONValue.parse(bytes), codingPath: []))
    }

    public func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws -> T {
        try T(from: TreeDecoder(value: value, codingPath: []))
    }
}

/// A node being built by the encoder; containers write into it.
private final class Slot {
    enum Content {
        case value(JSONValue)
        case object([(String, Slot)])
        case array([Slot])
    }

    var content: Content = .value(.null)

    var value: JSONValue {
        switch content {
        case .value(let value): return value
        case .object(let members): return .object(members.map { ($0.0, $0.1.value) })
        case .array(let items): return .array(items.map(\.value))
        }
    }
}

private struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(stringValue: String) { self.stringValue = stringValue }
    init(intValue: Int) {
        stringValue = String(intValue)
        self.intValue = intValue
    }
}

private final class TreeEncoder: Encoder {
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    let storage = Slot()

    init(codingPath: [any CodingKey]) { self.codingPath = codingPath }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .object = storage.content {} else { storage.content = .object([]) }
        return KeyedEncodingContainer(KeyedEncoder<Key>(slot: storage, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .array = storage.content {} else { storage.content = .array([]) }
        return UnkeyedEncoder(slot: storage, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleEncoder(slot: storage, codingPath: codingPath)
    }
}

private func encodeValue<T: Encodable>(_ value: T, path: [any CodingKey]) throws -> Slot {
    let slot = Slot()
    switch value {
    case let text as String: slot.content = .value(.string(text))
    case let flag as Bool: slot.content = .value(.bool(flag))
    case let number as Int: slot.content = .value(.number(String(number)))
    case let number as Double: slot.content = .value(.number(JSONValue.numberText(number)))
    case let number as any BinaryInteger: slot.content = .value(.number("\(number)"))
    case let number as Float: slot.content = .value(.number(JSONValue.numberText(Double(number))))
    default:
        let encoder = TreeEncoder(codingPath: path)
        try value.encode(to: encoder)
        return encoder.storage
    }
    return slot
}

private struct KeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let slot: Slot
    let codingPath: [any CodingKey]

    private func put(_ key: Key, _ child: Slot) {
        guard case .object(var members) = slot.content else { return }
        if let index = members.firstIndex(where: { $0.0 == key.stringValue }) {
            members[index].1 = child
        } else {
            members.append((key.stringValue, child))
        }
        slot.content = .object(members)
    }

    private func leaf(_ value: JSONValue) -> Slot {
        let child = Slot()
        child.content = .value(value)
        return child
    }

    mutating func encodeNil(forKey key: Key) throws { put(key, leaf(.null)) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { put(key, leaf(.bool(value))) }
    mutating func encode(_ value: String, forKey key: Key) throws { put(key, leaf(.string(value))) }
    mutating func encode(_ value: Double, forKey key: Key) throws { put(key, leaf(.number(JSONValue.numberText(value)))) }
    mutating func encode(_ value: Int, forKey key: Key) throws { put(key, leaf(.number(String(value)))) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        put(key, try encodeValue(value, path: codingPath + [key]))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let child = Slot()
        child.content = .object([])
        put(key, child)
        return KeyedEncodingContainer(KeyedEncoder<NestedKey>(slot: child, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let child = Slot()
        child.content = .array([])
        put(key, child)
        return UnkeyedEncoder(slot: child, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder { TreeEncoder(codingPath: codingPath) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { TreeEncoder(codingPath: codingPath + [key]) }
}

private struct UnkeyedEncoder: UnkeyedEncodingContainer {
    let slot: Slot
    let codingPath: [any CodingKey]
    var count: Int {
        if case .array(let items) = slot.content { return items.count }
        return 0
    }

    private func append(_ child: Slot) {
        guard case .array(var items) = slot.content else { return }
        items.append(child)
        slot.content = .array(items)
    }

    mutating func encodeNil() throws {
        let child = Slot()
        append(child)
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        append(try encodeValue(value, path: codingPath + [AnyKey(intValue: count)]))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let child = Slot()
        child.content = .object([])
        append(child)
        return KeyedEncodingContainer(KeyedEncoder<NestedKey>(slot: child, codingPath: codingPath))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let child = Slot()
        child.content = .array([])
        append(child)
        return UnkeyedEncoder(slot: child, codingPath: codingPath)
    }

    mutating func superEncoder() -> any Encoder { TreeEncoder(codingPath: codingPath) }
}

private struct SingleEncoder: SingleValueEncodingContainer {
    let slot: Slot
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { slot.content = .value(.null) }
    mutating func encode(_ value: Bool) throws { slot.content = .value(.bool(value)) }
    mutating func encode(_ value: String) throws { slot.content = .value(.string(value)) }
    mutating func encode(_ value: Double) throws { slot.content = .value(.number(JSONValue.numberText(value))) }
    mutating func encode(_ value: Int) throws { slot.content = .value(.number(String(value))) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        slot.content = try encodeValue(value, path: codingPath).content
    }
}

private struct TreeDecoder: Decoder {
    let value: JSONValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw mismatch("an object") }
        var table: [String: JSONValue] = [:]
        for (key, member) in members { table[key] = member }
        return KeyedDecodingContainer(KeyedDecoder<Key>(members: table, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let items) = value else { throw mismatch("an array") }
        return UnkeyedDecoder(items: items, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        SingleDecoder(value: value, codingPath: codingPath)
    }

    func mismatch(_ expected: String) -> JSONError {
        JSONError("\(pathText(codingPath)): expected \(expected)")
    }
}

private func pathText(_ path: [any CodingKey]) -> String {
    path.isEmpty ? "(top)" : path.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
}

private func decodeValue<T: Decodable>(_ type: T.Type, from value: JSONValue, path: [any CodingKey]) throws -> T {
    if T.self == String.self {
        guard case .string(let text) = value else { throw JSONError("\(pathText(path)): expected a string") }
        return text as! T
    }
    if T.self == Int.self { return try integer(value, path: path) as! T }
    if T.self == Double.self { return try double(value, path: path) as! T }
    if let integerType = T.self as? any FixedWidthInteger.Type {
        let whole = try integer(value, path: path)
        guard let converted = integerType.init(exactly: whole) else { throw JSONError("\(pathText(path)): \(whole) is out of range") }
        return converted as! T
    }
    if T.self == Bool.self {
        guard case .bool(let flag) = value else { throw JSONError("\(pathText(path)): expected true or false") }
        return flag as! T
    }
    return try T(from: TreeDecoder(value: value, codingPath: path))
}

private func integer(_ value: JSONValue, path: [any CodingKey]) throws -> Int {
    guard case .number(let text) = value else { throw JSONError("\(pathText(path)): expected a number") }
    if let exact = Int(text) { return exact }
    guard let approximate = Double(text), approximate == approximate.rounded(), abs(approximate) < 9e18 else {
        throw JSONError("\(pathText(path)): \(text) is not a whole number")
    }
    return Int(approximate)
}

private func double(_ value: JSONValue, path: [any CodingKey]) throws -> Double {
    guard case .number(let text) = value, let number = Double(text) else { throw JSONError("\(pathText(path)): expected a number") }
    return number
}

private struct KeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [String: JSONValue]
    let codingPath: [any CodingKey]
    var allKeys: [Key] { members.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { members[key.stringValue] != nil }

    private func member(_ key: Key) throws -> JSONValue {
        guard let value = members[key.stringValue] else { throw JSONError("\(pathText(codingPath + [key])): missing") }
        return value
    }

    func decodeNil(forKey key: Key) throws -> Bool { (members[key.stringValue] ?? .null) == .null }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try decodeValue(type, from: try member(key), path: codingPath + [key])
    }

    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        guard let value = members[key.stringValue], value != .null else { return nil }
        return try decodeValue(type, from: value, path: codingPath + [key])
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try TreeDecoder(value: try member(key), codingPath: codingPath + [key]).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try TreeDecoder(value: try member(key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder { TreeDecoder(value: .object(members.map { ($0.key, $0.value) }), codingPath: codingPath) }
    func superDecoder(forKey key: Key) throws -> any Decoder { TreeDecoder(value: try member(key), codingPath: codingPath + [key]) }
}

private struct UnkeyedDecoder: UnkeyedDecodingContainer {
    let items: [JSONValue]
    let codingPath: [any CodingKey]
    var currentIndex = 0
    var count: Int? { items.count }
    var isAtEnd: Bool { currentIndex >= items.count }

    init(items: [JSONValue], codingPath: [any CodingKey]) {
        self.items = items
        self.codingPath = codingPath
    }

    private mutating func next() throws -> (JSONValue, [any CodingKey]) {
        guard !isAtEnd else { throw JSONError("\(pathText(codingPath)): fewer items than expected") }
        defer { currentIndex += 1 }
        return (items[currentIndex], codingPath + [AnyKey(intValue: currentIndex)])
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, items[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let (value, path) = try next()
        return try decodeValue(type, from: value, path: path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        let (value, path) = try next()
        return try TreeDecoder(value: value, codingPath: path).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let (value, path) = try next()
        return try TreeDecoder(value: value, codingPath: path).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder {
        let (value, path) = try next()
        return TreeDecoder(value: value, codingPath: path)
    }
}

private struct SingleDecoder: SingleValueDecodingContainer {
    let value: JSONValue
    let codingPath: [any CodingKey]

    func decodeNil() -> Bool { value == .null }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try decodeValue(type, from: value, path: codingPath) }
}
