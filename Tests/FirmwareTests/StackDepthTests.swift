import Board
import Control
import Reactor
import Testing

/// Issue #29: the event loops run on a 256 KiB stack (EventLoop.stackSize),
/// not glibc's 8 MiB. What recurses on the I/O loop is bounded: a control
/// request's JSON (64 levels) and the board file's YAML on a reload (32).
/// Each is parsed at its limit, and far past it, on a thread of that size,
/// in this debug build, whose frames are larger than a release build's.
@Suite("The loops' stacks hold the deepest input they parse")
struct StackDepthTests {
    /// Runs `body` on a thread with the I/O loop's stack; a stack that is
    /// too small ends the test process (SIGSEGV on the guard page).
    static func onLoopStack<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Promise<T>()
        let thread = OSThread(name: "depth-test", stackSize: EventLoop.stackSize)
        thread.start { result.fulfil(body()) }
        thread.join()
        return result.wait()
    }

    @Test("A control request nested to the JSON parser's limit parses, and ten thousand levels are refused, on a loop's stack")
    func json() {
        let outcomes = Self.onLoopStack { () -> [Bool] in
            [JSONValue.maximumDepth, JSONValue.maximumDepth + 1, 10_000].map { depth in
                let text = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
                return (try? JSONValue.parse(Array(text.utf8))) != nil
            }
        }
        #expect(outcomes == [true, false, false])
    }

    /// A board file whose `extra:` key holds a mapping `depth` levels deep
    /// (block style) or a flow sequence as deep.
    static func nested(_ depth: Int, flow: Bool) -> String {
        let value: String
        if flow {
            value = " " + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "\n"
        } else {
            value = "\n" + (1..<depth).map { level in String(repeating: "  ", count: level) + "k\(level):" }.joined(separator: "\n") + " 1\n"
        }
        return "name: deep\nextra:" + value
    }

    @Test("A board file nested to the YAML parser's limit, block and flow, is read (a problem, not a crash), and deeper ones are refused, on a loop's stack")
    func yaml() {
        let problems = Self.onLoopStack { () -> [String] in
            // A flow sequence under `extra:` is one level deeper than its brackets.
            [(32, false), (31, true), (33, false), (32, true), (5000, true)].map { depth, flow in
                do {
                    _ = try BoardFile.parse(Self.nested(depth, flow: flow), path: "deep.yaml")
                    return "parsed"
                } catch {
                    return "\(error)"
                }
            }
        }
        // At the limit the parser reads it all: what is wrong is the schema's
        // (an unknown key); past it, the nesting itself.
        for problem in problems.prefix(2) { #expect(!problem.contains("nested deeper"), "\(problem)") }
        for problem in problems.dropFirst(2) { #expect(problem.contains("nested deeper"), "\(problem)") }
    }
}
