// libFuzzer target: the board-file parser (YAML subset, schema, validation).
//
// Any text either becomes a configuration or is refused with problems that
// each name the file, and a line whenever the text has one to blame, the
// `file:line: field: message` a user is shown before exit status 2. A
// configuration that was accepted must survive being parsed again from the
// same text identically (no hidden state between parses).
import Board
import FuzzSupport

@_cdecl("fuzz_board_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv, fuzzBoard)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBoard(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    do {
        let configuration = try BoardFile.parse(text, path: "fuzz.yaml")
        let again = try? BoardFile.parse(text, path: "fuzz.yaml")
        precondition(again == configuration, "the same text parsed twice gave two configurations")
    } catch {
        precondition(!error.problems.isEmpty, "a refusal without a problem")
        for problem in error.problems {
            precondition(problem.path == "fuzz.yaml", "problem names \(problem.path)")
            precondition(!problem.message.isEmpty, "problem without a message: \(problem)")
        }
    }
    return 0
}
