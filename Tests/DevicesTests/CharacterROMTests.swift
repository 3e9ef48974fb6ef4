import Devices
import Testing

@Suite("CharacterROM")
struct CharacterROMTests {
    @Test("printable ASCII maps to itself, except \\ and ~ which A00 lacks")
    func ascii() {
        let printable = (0x20...0x7D).filter { $0 != 0x5C }.map { UInt8($0) }
        let text = String(decoding: printable, as: UTF8.self)
        #expect(CharacterROM.encode(text) == printable)
        #expect(CharacterROM.encode("a\\b~c") == [0x61, CharacterROM.fallback, 0x62, CharacterROM.fallback, 0x63])
    }

    @Test("characters A00 has map to their codes (datasheet Table 4)", arguments: [
        ("¥", 0x5C), ("→", 0x7E), ("←", 0x7F), ("°", 0xDF), ("α", 0xE0), ("ä", 0xE1), ("β", 0xE2),
        ("ß", 0xE2), ("ε", 0xE3), ("µ", 0xE4), ("μ", 0xE4), ("σ", 0xE5), ("ρ", 0xE6), ("√", 0xE8),
        ("¢", 0xEC), ("£", 0xED), ("ñ", 0xEE), ("ö", 0xEF), ("θ", 0xF2), ("∞", 0xF3), ("Ω", 0xF4),
        ("\u{2126}", 0xF4), ("ü", 0xF5), ("Σ", 0xF6), ("π", 0xF7), ("÷", 0xFD), ("█", 0xFF),
        ("ｱ", 0xB1), ("｡", 0xA1), ("ﾟ", 0xDF),
    ] as [(String, Int)])
    func romCharacters(text: String, code: Int) {
        #expect(CharacterROM.encode(text) == [UInt8(code)])
    }

    @Test("decomposed spellings match too; capital umlauts use the lowercase glyphs")
    func equivalence() {
        #expect(CharacterROM.encode("a\u{0308}o\u{0308}u\u{0308}") == [0xE1, 0xEF, 0xF5])
        #expect(CharacterROM.encode("ÄÖÜ") == [0xE1, 0xEF, 0xF5])
    }

    @Test("other accented Latin letters fold to their base letter")
    func folding() {
        #expect(CharacterROM.encode("Café") == Array("Cafe".utf8))
        #expect(CharacterROM.encode("e\u{0301}Å") == Array("eA".utf8))
    }

    @Test("anything else is one visible fallback cell per character")
    func fallback() {
        #expect(CharacterROM.fallback == 0xFF)
        #expect(CharacterROM.encode("5€") == [0x35, 0xFF])
        // One grapheme cluster (thumbs up + skin tone) is one cell.
        #expect(CharacterROM.encode("👍🏽!") == [0xFF, 0x21])
        #expect(CharacterROM.encode("中") == [0xFF])
    }

    @Test("control characters become spaces, never CGRAM codes")
    func controls() {
        #expect(CharacterROM.encode("a\tb\r\nc\u{0}\u{7F}") == [0x61, 0x20, 0x62, 0x20, 0x63, 0x20, 0x20])
    }

    @Test("a voiced half-width kana is two cells, as on paper")
    func halfWidthKana() {
        #expect(CharacterROM.encode("ｶﾞ") == [0xB6, 0xDE])
    }

    @Test("invalid UTF-8 never traps: each bad sequence is a fallback cell")
    func invalidUTF8() {
        #expect(CharacterROM.encode(utf8: [0x48, 0xFF, 0xC3, 0x69]) == [0x48, 0xFF, 0xFF, 0x69])
        #expect(CharacterROM.encode(utf8: [0xC3, 0xA4]) == [0xE1])
        #expect(CharacterROM.encode(utf8: []) == [])
        #expect(CharacterROM.encode(utf8: [0xED, 0xA0, 0x80]).allSatisfy { $0 == 0xFF })
        // Every possible byte, alone and in pairs.
        for first in 0...255 {
            #expect(CharacterROM.encode(utf8: [UInt8(first)]).count == 1)
            for second in stride(from: 0, through: 255, by: 17) {
                #expect(!CharacterROM.encode(utf8: [UInt8(first), UInt8(second)]).isEmpty)
            }
        }
    }

    @Test("decode gives exactly one character per code, for all 256 codes")
    func decodeOnePerCode() {
        let all = (0...255).map { UInt8($0) }
        #expect(CharacterROM.decode(all).count == 256)
        for code in all {
            #expect(CharacterROM.decode([0x41, code, 0x42]).count == 3)
        }
    }

    @Test("decode undoes encode for text the ROM can show")
    func roundTrip() {
        for text in ["Hello, world!", "¥100 → 20°C", "μs π Ω ä ö ü", "ｱｲｳ"] {
            #expect(CharacterROM.decode(CharacterROM.encode(text)) == text)
        }
    }
}
