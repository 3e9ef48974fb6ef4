#if canImport(Glibc)
import Glibc
#endif
import Reactor
import Testing

@Suite("Text from outside, printed or logged: every control character visible, the length bounded")
struct EscapingTests {
    @Test("Terminal escapes (a window title, clear screen, colours), newlines and tabs become visible escapes")
    func terminalEscapes() {
        #expect("\u{1b}]0;title\u{07}rc-car".escaped(maximumLength: 100) == "\\x1b]0;title\\x07rc-car")
        #expect("\u{1b}[2J\u{1b}[H".escaped(maximumLength: 100) == "\\x1b[2J\\x1b[H")
        #expect("\u{1b}[31mred\u{1b}[0m".escaped(maximumLength: 100) == "\\x1b[31mred\\x1b[0m")
        #expect("online\nFAILSAFE: none\r\tx".escaped(maximumLength: 100) == "online\\nFAILSAFE: none\\r\\tx")
        #expect("a\u{0}b\u{7f}c\u{08}".escaped(maximumLength: 100) == "a\\x00b\\x7fc\\x08")
        // A backslash is doubled, so `\x1b` typed by a sender stays distinct from an escaped ESC.
        #expect("C:\\x1b".escaped(maximumLength: 100) == "C:\\\\x1b")
        for escaped in ["\u{1b}]0;title\u{07}", "\u{1b}[2J", "\u{1b}[31m", "x\ny"].map({ $0.escaped(maximumLength: 100) }) {
            #expect(!escaped.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7f }, "\(escaped)")
        }
    }

    @Test("C1 controls and the characters that reorder or break lines are escaped; other Unicode stays")
    func unicode() {
        #expect("a\u{9b}2Jb\u{85}".escaped(maximumLength: 100) == "a\\u{9b}2Jb\\u{85}")
        #expect("x\u{202e}gpj.exe\u{2069}\u{2028}".escaped(maximumLength: 100) == "x\\u{202e}gpj.exe\\u{2069}\\u{2028}")
        #expect("Grüße · 1500 µs · 🚗".escaped(maximumLength: 100) == "Grüße · 1500 µs · 🚗")
    }

    @Test("Invalid UTF-8 is shown byte by byte: stray continuation, overlong, surrogate, past U+10FFFF, cut short")
    func invalidUTF8() {
        #expect(String(escaping: [0x6F, 0x6B, 0xFF, 0x80], maximumLength: 100) == "ok\\xff\\x80")
        // An overlong "/" and an overlong NUL, then a UTF-16 surrogate.
        #expect(String(escaping: [0xC0, 0xAF, 0xC0, 0x80, 0xED, 0xA0, 0x80], maximumLength: 100) == "\\xc0\\xaf\\xc0\\x80\\xed\\xa0\\x80")
        #expect(String(escaping: [0xF4, 0x90, 0x80, 0x80], maximumLength: 100) == "\\xf4\\x90\\x80\\x80")
        // A sequence cut by the end of the input or by an ASCII byte.
        #expect(String(escaping: [0x61, 0xE2, 0x82], maximumLength: 100) == "a\\xe2\\x82")
        #expect(String(escaping: [0xE2, 0x82, 0x41], maximumLength: 100) == "\\xe2\\x82A")
        #expect(String(escaping: Array("µ€😀".utf8), maximumLength: 100) == "µ€😀")
    }

    @Test("The length is bounded: cut with …, never inside an escape, whatever the input's size")
    func length() {
        #expect("abcdef".escaped(maximumLength: 6) == "abcdef")
        #expect("abcdefg".escaped(maximumLength: 6) == "abcde…")
        #expect("abc\u{1b}".escaped(maximumLength: 6) == "abc…")
        #expect("abc\u{1b}".escaped(maximumLength: 7) == "abc\\x1b")
        #expect("abc".escaped(maximumLength: 0) == "")
        let huge = [UInt8](repeating: 0x1b, count: 8 << 20)
        let shown = String(escaping: huge, maximumLength: 64)
        #expect(shown.unicodeScalars.count == 61 && shown.hasSuffix("\\x1b…"), "\(shown)")
    }
}

@Suite("One place in the code logs at most a burst a window")
struct LogLimiterTests {
    @Test("A burst per window per key, the rest counted and said by the next line let through; keys apart")
    func burstThenHeldBack() {
        let limiter = LogLimiter(burst: 3, window: .seconds(60))
        let t0 = ContinuousClock.now
        let verdicts = (0..<10).map { limiter.admit("a.swift:1", at: t0 + .seconds($0)) }
        #expect(verdicts == [.log(heldBack: 0), .log(heldBack: 0), .log(heldBack: 0)] + Array(repeating: .drop, count: 7))
        #expect(limiter.admit("b.swift:2", at: t0 + .seconds(10)) == .log(heldBack: 0), "another place has its own burst")
        #expect(limiter.admit("a.swift:1", at: t0 + .seconds(59)) == .drop, "still the first window")
        #expect(limiter.admit("a.swift:1", at: t0 + .seconds(60)) == .log(heldBack: 8), "a new window: the line says 8 were held back")
        #expect(limiter.admit("a.swift:1", at: t0 + .seconds(61)) == .log(heldBack: 0))
    }
}
