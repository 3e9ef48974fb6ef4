import Hardware
import Reactor

typealias Node = YAML.Node

/// Why a board file was refused: every problem found, one per line, as
/// `file:line: field: what is wrong` so editors can jump to it.
public struct BoardFileError: Error, Sendable, CustomStringConvertible {
    public struct Problem: Sendable, Equatable, CustomStringConvertible {
        public var path: String
        /// 1-based line, nil when the problem has no place (unreadable file).
        public var line: Int?
        /// The dotted field name, e.g. `servo.channels[2].max_us`.
        public var field: String
        public var message: String

        public var description: String {
            "\(path):\(line.map(String.init) ?? "0"): \(field): \(message)"
        }
    }

    public var problems: [Problem]
    public var description: String { problems.map(\.description).joined(separator: "\n") }
}

/// Reads and validates board files. Unknown keys are errors, so a typo such
/// as `frequncy_hz` is reported instead of silently using the default.
public enum BoardFile {
    /// The largest board file accepted: real ones are a few kilobytes, and
    /// a limit keeps a mistaken (or hostile) 100 MB file from costing
    /// gigabytes before it is refused.
    public static let maximumSize = 1 << 20

    /// Loads and validates the board file at `path`.
    public static func load(path: String) throws(BoardFileError) -> BoardConfiguration {
        let bytes: [UInt8]
        do {
            bytes = try Files.read(path, limit: maximumSize)
        } catch {
            throw BoardFileError(problems: [.init(path: path, line: error == .tooLarge(limit: maximumSize) ? 1 : nil, field: "file", message: "\(error)")])
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw BoardFileError(problems: [.init(path: path, line: nil, field: "file", message: "is not UTF-8 text")])
        }
        return try parse(text, path: path)
    }

    /// Validates board-file text; `path` is only used in messages.
    public static func parse(_ text: String, path: String) throws(BoardFileError) -> BoardConfiguration {
        let reader = BoardReader(path: path)
        guard text.utf8.count <= maximumSize else {
            throw BoardFileError(problems: [.init(path: path, line: 1, field: "file", message: "is larger than \(maximumSize) bytes")])
        }
        let root: Node?
        do {
            root = try YAML.parse(text)
        } catch {
            throw BoardFileError(problems: [.init(path: path, line: error.line, field: "yaml", message: error.message)])
        }
        guard let root else {
            throw BoardFileError(problems: [.init(path: path, line: 1, field: "file", message: "is empty")])
        }
        let configuration = reader.board(root)
        if let configuration, reader.problems.isEmpty { return configuration }
        throw BoardFileError(problems: reader.problems)
    }
}

/// A mapping node with its keys checked against what the schema allows.
struct Fields {
    let node: Node
    let field: String
    let entries: [String: Node]

    func path(_ key: String) -> String { field.isEmpty ? key : "\(field).\(key)" }
}

/// Walks the YAML tree, collecting every problem rather than stopping at
/// the first, so one edit-run cycle fixes a whole file.
final class BoardReader {
    let path: String
    private(set) var problems: [BoardFileError.Problem] = []

    /// When not nil, every mapping the schema reads is recorded here: its
    /// field, the keys it allows and the line of the schema that asked.
    /// The test that keeps blecontrol-board(5) in step with the parser
    /// reads it.
    var schemaTrace: [(field: String, allowed: Set<String>, site: UInt)]?

    /// Unknown keys are skipped rather than reported (the crash cleanup's
    /// reading of a board file someone may have broken).
    var lenient = false

    init(path: String) { self.path = path }

    func fail(_ node: Node?, _ field: String, _ message: String) {
        problems.append(.init(path: path, line: node?.line, field: field, message: message))
    }

    // MARK: Generic readers

    func mapping(_ node: Node, _ field: String, allowed: Set<String>, site: UInt = #line) -> Fields? {
        schemaTrace?.append((field, allowed, site))
        guard case .mapping(let mapping, _) = node else {
            fail(node, field.isEmpty ? "file" : field, "must be a mapping of keys to values")
            return nil
        }
        var entries: [String: Node] = [:]
        for (key, value) in mapping {
            guard let name = key.scalarText else {
                fail(key, field, "keys must be plain names")
                continue
            }
            let fieldName = field.isEmpty ? name : "\(field).\(name)"
            if !allowed.contains(name) {
                if lenient { continue }
                fail(key, fieldName, "unknown key (expected one of: \(allowed.sorted().joined(separator: ", ")))")
            } else if entries[name] != nil {
                fail(key, fieldName, "appears twice")
            } else {
                entries[name] = value
            }
        }
        return Fields(node: node, field: field, entries: entries)
    }

    func scalar(_ fields: Fields, _ key: String, required: Bool = false) -> (Node, String)? {
        guard let node = fields.entries[key] else {
            if required { fail(fields.node, fields.path(key), "is required") }
            return nil
        }
        guard let scalar = node.scalarText else {
            fail(node, fields.path(key), "must be a single value")
            return nil
        }
        return (node, scalar)
    }

    func string(_ fields: Fields, _ key: String, required: Bool = false, default value: String? = nil) -> String? {
        guard let (node, text) = scalar(fields, key, required: required) else { return value }
        if text.isEmpty {
            fail(node, fields.path(key), "must not be empty")
            return nil
        }
        return text
    }

    /// Integers in decimal or 0x-hex, `_` allowed as a digit separator.
    func integer(_ fields: Fields, _ key: String, in range: ClosedRange<Int>, required: Bool = false, default value: Int? = nil) -> Int? {
        guard let (node, text) = scalar(fields, key, required: required) else { return value }
        guard let number = Self.parseInteger(text) else {
            fail(node, fields.path(key), "\"\(text)\" is not a whole number")
            return nil
        }
        guard range.contains(number) else {
            fail(node, fields.path(key), "\(text) is out of range \(Self.show(range.lowerBound))…\(Self.show(range.upperBound))")
            return nil
        }
        return number
    }

    func number(_ fields: Fields, _ key: String, in range: ClosedRange<Double>, required: Bool = false, default value: Double? = nil) -> Double? {
        guard let (node, text) = scalar(fields, key, required: required) else { return value }
        let cleaned = String(text.filter { $0 != "_" })
        guard let number = Self.parseInteger(text).map(Double.init) ?? Double(cleaned), number.isFinite else {
            fail(node, fields.path(key), "\"\(text)\" is not a number")
            return nil
        }
        guard range.contains(number) else {
            fail(node, fields.path(key), "\(text) is out of range \(Self.show(range.lowerBound))…\(Self.show(range.upperBound))")
            return nil
        }
        return number
    }

    func bool(_ fields: Fields, _ key: String, default value: Bool) -> Bool {
        guard let (node, text) = scalar(fields, key) else { return value }
        switch text.lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default:
            fail(node, fields.path(key), "\"\(text)\" is not true or false")
            return value
        }
    }

    func choice<T>(_ fields: Fields, _ key: String, _ options: [String: T], default value: T?) -> T? {
        guard let (node, text) = scalar(fields, key) else { return value }
        guard let chosen = options[text] else {
            fail(node, fields.path(key), "\"\(text)\" is not one of: \(options.keys.sorted().joined(separator: ", "))")
            return nil
        }
        return chosen
    }

    func address(_ fields: Fields, _ key: String, default value: Int) -> I2CAddress? {
        // 7-bit addresses outside 0x03…0x77 are reserved (I2C-bus
        // specification UM10204 §3.1.12).
        guard let raw = integer(fields, key, in: 0x03...0x77, default: value) else { return nil }
        return I2CAddress(raw)
    }

    func milliseconds(_ fields: Fields, _ key: String, max: Int, default value: Int) -> Duration? {
        guard let number = integer(fields, key, in: 0...max, default: value) else { return nil }
        return number == 0 ? nil : .milliseconds(number)
    }

    static func parseInteger(_ text: String) -> Int? {
        let cleaned = String(text.filter { $0 != "_" }).lowercased()
        if cleaned.hasPrefix("0x") { return Int(cleaned.dropFirst(2), radix: 16) }
        return Int(cleaned)
    }

    static func show(_ value: some BinaryInteger) -> String { "\(value)" }
    static func show(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? "\(Int(value))" : "\(value)"
    }
}
