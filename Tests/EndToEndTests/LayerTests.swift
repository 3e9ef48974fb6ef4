import Foundation
import Testing

/// docs/architecture.md's table of targets is the layer rule: each row a
/// layer, lowest first. A target imports only targets of the rows above
/// its own, and each row's "imports" cell lists exactly the project's
/// targets its sources import. Read from the document and the sources, so
/// neither can drift from the other.
struct LayerTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The table's rows: the targets of each, and the targets its imports cell names.
    static func layers() throws -> [(targets: [String], imports: Set<String>)] {
        let text = try String(contentsOf: root.appendingPathComponent("docs/architecture.md"), encoding: .utf8)
        guard let start = text.range(of: "## The targets") else { return [] }
        let section = text[start.upperBound...].prefix { _ in true }
        let end = section.range(of: "\n## ")?.lowerBound ?? section.endIndex
        func names(_ cell: Substring) -> [String] {
            cell.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
        }
        return section[..<end].split(separator: "\n").compactMap { line in
            let cells = line.split(separator: "|", omittingEmptySubsequences: false)
            guard line.hasPrefix("| `"), cells.count >= 4 else { return nil }
            return (names(cells[1]), Set(names(cells[3])))
        }
    }

    /// The modules each target's sources import.
    static func imports(of target: String) throws -> Set<String> {
        let directory = root.appendingPathComponent("Sources/\(target)")
        var found: Set<String> = []
        guard let files = FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil) else { return found }
        for case let file as URL in files where file.pathExtension == "swift" || file.pathExtension == "h" || file.pathExtension == "c" {
            for line in try String(contentsOf: file, encoding: .utf8).split(separator: "\n") {
                let words = line.split(separator: " ")
                if let index = words.firstIndex(of: "import"), index == 0 || words[0] == "@testable" || words[0].hasPrefix("@_") {
                    if index + 1 < words.count { found.insert(String(words[index + 1])) }
                }
            }
        }
        return found
    }

    @Test("docs/architecture.md's layers hold: no target imports one of its own row or below, and each row lists its imports exactly")
    func layersHold() throws {
        let layers = try Self.layers()
        #expect(layers.count > 10, "the table of docs/architecture.md, \"The targets\", was not found")
        let targets = try FileManager.default.contentsOfDirectory(atPath: Self.root.appendingPathComponent("Sources").path).filter { !$0.hasPrefix(".") }
        var rowOf: [String: Int] = [:]
        for (row, layer) in layers.enumerated() {
            for target in layer.targets {
                #expect(rowOf[target] == nil, "\(target) is in two rows")
                rowOf[target] = row
            }
        }
        for target in targets {
            #expect(rowOf[target] != nil, "Sources/\(target) is not in docs/architecture.md's table of targets")
        }
        for (row, layer) in layers.enumerated() {
            var imported: Set<String> = []
            for target in layer.targets {
                #expect(targets.contains(target), "docs/architecture.md names \(target), which is not in Sources/")
                let ours = try Self.imports(of: target).filter { rowOf[$0] != nil }
                for module in ours {
                    #expect(rowOf[module]! < row, "\(target) imports \(module), which is not in a row above it")
                }
                imported.formUnion(ours)
            }
            #expect(imported == layer.imports.intersection(Set(rowOf.keys)),
                    "\(layer.targets): the sources import \(imported.sorted()), the table says \(layer.imports.sorted())")
        }
    }
}
