/// The part of YAML 1.2 that board files use, parsed without a library:
/// block mappings and sequences by indentation, flow mappings `{ a: 1 }`
/// and sequences `[a, b]` (which may span lines), plain, single- and
/// double-quoted scalars, comments, and an optional `---` at the top.
/// Anchors, aliases, tags and block scalars (`|`, `>`) are refused with a
/// clear message: a board file has no use for them, and each is a way to
/// make a small file expand into a large tree.
///
/// Bounded by construction: the caller limits the text's size
/// (``BoardFile/maximumSize``), nesting deeper than ``maximumDepth`` is an
/// error rather than a stack overflow, and the parser allocates nothing per
/// byte beyond the nodes it returns.
struct YAML {
    /// A parsed node with the 1-based line it starts on.
    indirect enum Node: Equatable {
        case scalar(String, line: Int)
        case mapping([(key: Node, value: Node)], line: Int)
        case sequence([Node], line: Int)

        var line: Int {
            switch self {
            case .scalar(_, let line), .mapping(_, let line), .sequence(_, let line): return line
            }
        }

        /// The text of a scalar, nil for a collection.
        var scalarText: String? {
            if case .scalar(let text, _) = self { return text }
            return nil
        }

        static func == (lhs: Node, rhs: Node) -> Bool {
            switch (lhs, rhs) {
            case (.scalar(let a, let la), .scalar(let b, let lb)): return a == b && la == lb
            case (.sequence(let a, let la), .sequence(let b, let lb)): return a == b && la == lb
            case (.mapping(let a, let la), .mapping(let b, let lb)):
                return la == lb && a.count == b.count && zip(a, b).allSatisfy { $0.key == $1.key && $0.value == $1.value }
            default: return false
            }
        }
    }

    /// A syntax error at a line.
    struct SyntaxError: Error, Equatable {
        var line: Int
        var message: String
    }

    /// How deep collections may nest. The deepest board-file path
    /// (servo → channels → item → key) is 4.
    static let maximumDepth = 32

    /// Parses `text`; nil for an empty document (only comments).
    static func parse(_ text: String) throws(SyntaxError) -> Node? {
        var parser = YAML(bytes: Array(text.utf8))
        return try parser.document()
    }

    private let bytes: [UInt8]
    /// Byte offset where each line starts.
    private var lineStarts: [Int] = [0]
    /// The line the block parser is on (0-based index into lineStarts).
    private var row = 0

    private init(bytes: [UInt8]) {
        self.bytes = bytes
        for (offset, byte) in bytes.enumerated() where byte == UInt8(ascii: "\n") {
            lineStarts.append(offset + 1)
        }
    }

    // MARK: Lines

    private var rowCount: Int { lineStarts.count }

    private func lineEnd(_ row: Int) -> Int {
        var end = row + 1 < lineStarts.count ? lineStarts[row + 1] - 1 : bytes.count
        if end > lineStarts[row], bytes[end - 1] == UInt8(ascii: "\r") { end -= 1 }
        return end
    }

    /// Indentation and the offset of the first content byte; nil for a
    /// blank or comment-only line.
    private func content(_ row: Int) throws(SyntaxError) -> (indent: Int, start: Int)? {
        var offset = lineStarts[row]
        let end = lineEnd(row)
        while offset < end, bytes[offset] == UInt8(ascii: " ") { offset += 1 }
        if offset < end, bytes[offset] == UInt8(ascii: "\t") {
            throw SyntaxError(line: row + 1, message: "tabs cannot indent YAML; use spaces")
        }
        if offset == end || bytes[offset] == UInt8(ascii: "#") { return nil }
        return (offset - lineStarts[row], offset)
    }

    /// Moves `row` to the next line with content (or past the end).
    private mutating func skipEmpty() throws(SyntaxError) {
        while row < rowCount, try content(row) == nil { row += 1 }
    }

    // MARK: Document and blocks

    private mutating func document() throws(SyntaxError) -> Node? {
        try skipEmpty()
        if row < rowCount, let (_, start) = try content(row), text(start, lineEnd(row)).hasPrefix("---") {
            let rest = text(start + 3, lineEnd(row)).trimmedSpaces
            guard rest.isEmpty || rest.hasPrefix("#") else { throw SyntaxError(line: row + 1, message: "nothing may follow --- on its line") }
            row += 1
            try skipEmpty()
        }
        guard row < rowCount, let (indent, _) = try content(row) else { return nil }
        let node = try block(indent: indent, depth: 1)
        try skipEmpty()
        if row < rowCount {
            throw SyntaxError(line: row + 1, message: "unexpected indentation (or a second document): the top level ends on line \(node.line)")
        }
        return node
    }

    /// The block node whose lines start at column `indent`, from `row`;
    /// `from` is where its first line's content starts when that is not the
    /// line's first content (a compact `- key: value` list item).
    private mutating func block(indent: Int, depth: Int, from first: Int? = nil) throws(SyntaxError) -> Node {
        guard depth <= Self.maximumDepth else { throw SyntaxError(line: row + 1, message: "nested deeper than \(Self.maximumDepth) levels") }
        guard let (_, lineStart) = try content(row) else { throw SyntaxError(line: row + 1, message: "expected a value") }
        let start = first ?? lineStart
        if isSequenceDash(at: start) { return try blockSequence(indent: indent, depth: depth, from: start) }
        if try keyColon(from: start, to: lineEnd(row)) != nil { return try blockMapping(indent: indent, depth: depth, from: start) }
        // A lone value (the whole document, or a value on its own line).
        let line = row + 1
        let (node, end) = try inlineValue(from: start, line: line, depth: depth)
        try expectLineEnd(after: end)
        return node
    }

    private func isSequenceDash(at offset: Int) -> Bool {
        guard bytes[offset] == UInt8(ascii: "-") else { return false }
        let next = offset + 1
        return next >= bytes.count || bytes[next] == UInt8(ascii: " ") || bytes[next] == UInt8(ascii: "\n") || bytes[next] == UInt8(ascii: "\r")
    }

    /// The next row with content from `row` on (blank and comment rows are
    /// skipped): where its content starts and at which column. The first
    /// item of a compact collection (after a list dash) starts at `pending`
    /// instead, at the collection's `indent`. Nil at the end of the text.
    private mutating func nextContent(_ pending: inout Int?, indent: Int) throws(SyntaxError) -> (start: Int, column: Int)? {
        while row < rowCount {
            guard let (lineColumn, lineStart) = try content(row) else {
                row += 1
                continue
            }
            defer { pending = nil }
            if let pending { return (pending, indent) }
            return (lineStart, lineColumn)
        }
        return nil
    }

    private mutating func blockSequence(indent: Int, depth: Int, from first: Int) throws(SyntaxError) -> Node {
        let firstLine = row + 1
        var items: [Node] = []
        var firstStart: Int? = first
        while let (start, column) = try nextContent(&firstStart, indent: indent) {
            if column < indent { break }
            guard column == indent, isSequenceDash(at: start) else {
                if column == indent { break }
                throw SyntaxError(line: row + 1, message: "bad indentation in a list (items start with - at column \(indent + 1))")
            }
            items.append(try sequenceItem(dashAt: start, indent: indent, depth: depth))
        }
        return .sequence(items, line: firstLine)
    }

    /// One `- item`: a value on the dash's line, a compact mapping starting
    /// there (`- key: value` with more keys below), or a block below.
    private mutating func sequenceItem(dashAt dash: Int, indent: Int, depth: Int) throws(SyntaxError) -> Node {
        var offset = dash + 1
        let end = lineEnd(row)
        while offset < end, bytes[offset] == UInt8(ascii: " ") { offset += 1 }
        if offset == end || bytes[offset] == UInt8(ascii: "#") {
            row += 1
            try skipEmpty()
            guard row < rowCount, let (column, _) = try content(row), column > indent else {
                return .scalar("", line: row)
            }
            return try block(indent: column, depth: depth + 1)
        }
        let column = offset - lineStarts[row]
        var startsBlock = isSequenceDash(at: offset)
        if !startsBlock { startsBlock = try keyColon(from: offset, to: end) != nil }
        if startsBlock {
            // The item's own block starts mid-line: parse it as if it were indented there.
            return try block(indent: column, depth: depth + 1, from: offset)
        }
        let (node, after) = try inlineValue(from: offset, line: row + 1, depth: depth + 1)
        try expectLineEnd(after: after)
        return node
    }

    private mutating func blockMapping(indent: Int, depth: Int, from first: Int) throws(SyntaxError) -> Node {
        let firstLine = row + 1
        var entries: [(key: Node, value: Node)] = []
        // The first key of a compact mapping in a list item sits after the dash.
        var firstStart: Int? = first
        while let (start, column) = try nextContent(&firstStart, indent: indent) {
            if column < indent { break }
            if column > indent {
                throw SyntaxError(line: row + 1, message: "bad indentation (keys of this mapping start at column \(indent + 1))")
            }
            if isSequenceDash(at: start) { break }
            let end = lineEnd(row)
            guard let colon = try keyColon(from: start, to: end) else {
                throw SyntaxError(line: row + 1, message: "expected `key: value`")
            }
            let key = try keyNode(from: start, to: colon, line: row + 1)
            var offset = colon + 1
            while offset < end, bytes[offset] == UInt8(ascii: " ") { offset += 1 }
            if offset == end || bytes[offset] == UInt8(ascii: "#") {
                let keyRow = row
                row += 1
                try skipEmpty()
                if row < rowCount, let (next, nextStart) = try content(row),
                   next > indent || (next == indent && isSequenceDash(at: nextStart)) {
                    entries.append((key, try block(indent: next, depth: depth + 1)))
                } else {
                    entries.append((key, .scalar("", line: keyRow + 1)))
                }
                continue
            }
            let (value, after) = try inlineValue(from: offset, line: row + 1, depth: depth + 1)
            entries.append((key, value))
            try expectLineEnd(after: after)
        }
        return .mapping(entries, line: firstLine)
    }

    /// After a value: only spaces and a comment until the end of its line;
    /// then moves to the next line.
    private mutating func expectLineEnd(after offset: Int) throws(SyntaxError) {
        // A flow collection may have ended on a later line than it started.
        while row + 1 < rowCount, lineStarts[row + 1] <= offset { row += 1 }
        var position = offset
        let end = lineEnd(row)
        while position < end, bytes[position] == UInt8(ascii: " ") { position += 1 }
        guard position == end || bytes[position] == UInt8(ascii: "#") else {
            throw SyntaxError(line: row + 1, message: "unexpected \"\(text(position, end))\" after the value")
        }
        row += 1
    }

    // MARK: Keys and inline values

    /// The offset of the `:` that ends a key on this line (followed by a
    /// space or the line's end), skipping quoted keys; nil when the line
    /// holds no key.
    private func keyColon(from start: Int, to end: Int) throws(SyntaxError) -> Int? {
        var offset = start
        let first = bytes[start]
        if first == UInt8(ascii: "\"") || first == UInt8(ascii: "'") {
            offset = try quotedEnd(from: start, line: lineNumber(of: start))
        } else if first == UInt8(ascii: "{") || first == UInt8(ascii: "[") {
            return nil
        }
        while offset < end {
            let byte = bytes[offset]
            if byte == UInt8(ascii: "#"), offset > start, bytes[offset - 1] == UInt8(ascii: " ") { return nil }
            if byte == UInt8(ascii: ":") {
                let next = offset + 1
                if next == end || bytes[next] == UInt8(ascii: " ") { return offset }
            }
            offset += 1
        }
        return nil
    }

    private func keyNode(from start: Int, to colon: Int, line: Int) throws(SyntaxError) -> Node {
        let first = bytes[start]
        if first == UInt8(ascii: "\"") || first == UInt8(ascii: "'") {
            let (value, _) = try quoted(from: start, line: line)
            return .scalar(value, line: line)
        }
        return .scalar(text(start, colon).trimmedSpaces, line: line)
    }

    /// A value that starts at `start`: flow collection, quoted or plain
    /// scalar. Returns it and the offset after it.
    private func inlineValue(from start: Int, line: Int, depth: Int) throws(SyntaxError) -> (Node, Int) {
        switch bytes[start] {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var cursor = start
            let node = try flow(&cursor, depth: depth)
            return (node, cursor)
        case UInt8(ascii: "\""), UInt8(ascii: "'"):
            let (value, end) = try quoted(from: start, line: line)
            return (.scalar(value, line: line), end)
        case UInt8(ascii: "|"), UInt8(ascii: ">"):
            throw SyntaxError(line: line, message: "block scalars (| and >) are not supported in board files")
        case UInt8(ascii: "&"), UInt8(ascii: "*"):
            throw SyntaxError(line: line, message: "anchors and aliases (& and *) are not supported in board files")
        case UInt8(ascii: "!"):
            throw SyntaxError(line: line, message: "tags (!) are not supported in board files")
        default:
            var end = start
            let lineStop = lineEndOffset(from: start)
            while end < lineStop {
                if bytes[end] == UInt8(ascii: "#"), end > start, bytes[end - 1] == UInt8(ascii: " ") { break }
                end += 1
            }
            return (.scalar(text(start, end).trimmedSpaces, line: line), end)
        }
    }

    // MARK: Flow collections

    private func lineNumber(of offset: Int) -> Int {
        // Binary search for the last line start <= offset.
        var low = 0
        var high = lineStarts.count - 1
        while low < high {
            let middle = (low + high + 1) / 2
            if lineStarts[middle] <= offset { low = middle } else { high = middle - 1 }
        }
        return low + 1
    }

    private func lineEndOffset(from offset: Int) -> Int {
        lineEnd(lineNumber(of: offset) - 1)
    }

    /// Skips spaces, newlines and comments inside a flow collection.
    private func skipFlowSpace(_ cursor: inout Int) {
        while cursor < bytes.count {
            switch bytes[cursor] {
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"):
                cursor += 1
            case UInt8(ascii: "#"):
                while cursor < bytes.count, bytes[cursor] != UInt8(ascii: "\n") { cursor += 1 }
            default:
                return
            }
        }
    }

    private func flow(_ cursor: inout Int, depth: Int) throws(SyntaxError) -> Node {
        let line = lineNumber(of: cursor)
        guard depth <= Self.maximumDepth else { throw SyntaxError(line: line, message: "nested deeper than \(Self.maximumDepth) levels") }
        let isMapping = bytes[cursor] == UInt8(ascii: "{")
        let close = isMapping ? UInt8(ascii: "}") : UInt8(ascii: "]")
        cursor += 1
        var items: [Node] = []
        var entries: [(key: Node, value: Node)] = []
        while true {
            skipFlowSpace(&cursor)
            guard cursor < bytes.count else {
                throw SyntaxError(line: line, message: "\(isMapping ? "{" : "[") is never closed")
            }
            if bytes[cursor] == close {
                cursor += 1
                return isMapping ? .mapping(entries, line: line) : .sequence(items, line: line)
            }
            if isMapping {
                let keyLine = lineNumber(of: cursor)
                let key = try flowScalar(&cursor, stopAtColon: true)
                skipFlowSpace(&cursor)
                guard cursor < bytes.count, bytes[cursor] == UInt8(ascii: ":") else {
                    throw SyntaxError(line: keyLine, message: "expected `key: value` in { }")
                }
                cursor += 1
                skipFlowSpace(&cursor)
                let value = try flowValue(&cursor, depth: depth)
                entries.append((key, value))
            } else {
                items.append(try flowValue(&cursor, depth: depth))
            }
            skipFlowSpace(&cursor)
            guard cursor < bytes.count else { continue }
            if bytes[cursor] == UInt8(ascii: ",") {
                cursor += 1
            } else if bytes[cursor] != close {
                throw SyntaxError(line: lineNumber(of: cursor), message: "expected , or \(isMapping ? "}" : "]")")
            }
        }
    }

    private func flowValue(_ cursor: inout Int, depth: Int) throws(SyntaxError) -> Node {
        guard cursor < bytes.count else { throw SyntaxError(line: lineNumber(of: cursor - 1), message: "expected a value") }
        switch bytes[cursor] {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            return try flow(&cursor, depth: depth + 1)
        case UInt8(ascii: "&"), UInt8(ascii: "*"), UInt8(ascii: "!"), UInt8(ascii: "|"), UInt8(ascii: ">"):
            throw SyntaxError(line: lineNumber(of: cursor), message: "anchors, aliases, tags and block scalars are not supported in board files")
        default:
            return try flowScalar(&cursor, stopAtColon: false)
        }
    }

    private func flowScalar(_ cursor: inout Int, stopAtColon: Bool) throws(SyntaxError) -> Node {
        let line = lineNumber(of: cursor)
        if bytes[cursor] == UInt8(ascii: "\"") || bytes[cursor] == UInt8(ascii: "'") {
            let (value, end) = try quoted(from: cursor, line: line)
            cursor = end
            return .scalar(value, line: line)
        }
        let start = cursor
        while cursor < bytes.count {
            let byte = bytes[cursor]
            if byte == UInt8(ascii: ",") || byte == UInt8(ascii: "]") || byte == UInt8(ascii: "}") || byte == UInt8(ascii: "\n") { break }
            if byte == UInt8(ascii: "#"), cursor > start, bytes[cursor - 1] == UInt8(ascii: " ") { break }
            if stopAtColon, byte == UInt8(ascii: ":") { break }
            if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
                throw SyntaxError(line: line, message: "unexpected \(byte == UInt8(ascii: "{") ? "{" : "[") inside a value")
            }
            cursor += 1
        }
        return .scalar(text(start, cursor).trimmedSpaces, line: line)
    }

    // MARK: Quoted scalars

    /// The offset after the closing quote.
    private func quotedEnd(from start: Int, line: Int) throws(SyntaxError) -> Int {
        try quoted(from: start, line: line).end
    }

    /// A quoted scalar: '…' with '' for a quote; "…" with the usual
    /// backslash escapes (\" \\ \n \t \r \0 \xHH \uHHHH).
    private func quoted(from start: Int, line: Int) throws(SyntaxError) -> (value: String, end: Int) {
        let quote = bytes[start]
        var offset = start + 1
        var value: [UInt8] = []
        while offset < bytes.count {
            let byte = bytes[offset]
            if byte == UInt8(ascii: "\n") { throw SyntaxError(line: line, message: "a quoted value must end on its line") }
            if byte == quote {
                if quote == UInt8(ascii: "'"), offset + 1 < bytes.count, bytes[offset + 1] == quote {
                    value.append(quote)
                    offset += 2
                    continue
                }
                return (String(decoding: value, as: UTF8.self), offset + 1)
            }
            if quote == UInt8(ascii: "\""), byte == UInt8(ascii: "\\"), offset + 1 < bytes.count {
                offset += 1
                switch bytes[offset] {
                case UInt8(ascii: "n"): value.append(10)
                case UInt8(ascii: "t"): value.append(9)
                case UInt8(ascii: "r"): value.append(13)
                case UInt8(ascii: "0"): value.append(0)
                case UInt8(ascii: "x"), UInt8(ascii: "u"):
                    let digits = bytes[offset] == UInt8(ascii: "x") ? 2 : 4
                    guard offset + digits < bytes.count,
                          let code = UInt32(String(decoding: bytes[(offset + 1)...(offset + digits)], as: UTF8.self), radix: 16),
                          let scalar = Unicode.Scalar(code) else {
                        throw SyntaxError(line: line, message: "bad \\\(digits == 2 ? "x" : "u") escape")
                    }
                    value.append(contentsOf: Array(String(Character(scalar)).utf8))
                    offset += digits
                default: value.append(bytes[offset])
                }
                offset += 1
                continue
            }
            value.append(byte)
            offset += 1
        }
        throw SyntaxError(line: line, message: "a quoted value is never closed")
    }

    private func text(_ start: Int, _ end: Int) -> String {
        String(decoding: bytes[start..<max(start, end)], as: UTF8.self)
    }
}

extension String {
    /// Without leading and trailing spaces (YAML's plain-scalar trimming).
    var trimmedSpaces: String {
        guard let first = firstIndex(where: { $0 != " " && $0 != "\t" }) else { return "" }
        let last = lastIndex(where: { $0 != " " && $0 != "\t" })!
        return String(self[first...last])
    }
}
